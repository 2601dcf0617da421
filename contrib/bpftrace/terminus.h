/*
 * What terminus's handshake_end probe points to (its third argument): the
 * handshake's phases and labels. The Rust side is HandshakeRecord in
 * crates/probes/src/lib.rs; the two change together.
 */
struct terminus_handshake {
	unsigned long total_ns;
	unsigned long hello_wait_ns;
	unsigned long hello_read_ns;
	unsigned long admission_ns;
	unsigned long to_crypto_ns;
	unsigned long crypto_queue_ns;
	unsigned long crypto_compute_ns;
	unsigned long remote_sign_ns;
	unsigned long server_ns;
	unsigned long client_ns;
	unsigned long resumed;
	char version[8];
	char key_type[16];
	char result[16];
	char tenant[32];
};
