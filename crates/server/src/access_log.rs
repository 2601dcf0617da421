//! The access log: one line per request, nginx's "combined"-like shape.

use std::fs::OpenOptions;
use std::io::{self, LineWriter, Write};
use std::sync::{Arc, Mutex};

use terminus_config::AccessLogTarget;

#[derive(Clone)]
pub struct AccessLog(Arc<Mutex<Box<dyn Write + Send>>>);

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessLog")
    }
}

impl AccessLog {
    pub fn open(target: &AccessLogTarget) -> io::Result<Option<Self>> {
        let writer: Box<dyn Write + Send> = match target {
            AccessLogTarget::Off => return Ok(None),
            AccessLogTarget::Stdout => Box::new(LineWriter::new(io::stdout())),
            AccessLogTarget::File(path) => Box::new(LineWriter::new(
                OpenOptions::new().create(true).append(true).open(path)?,
            )),
        };
        Ok(Some(Self(Arc::new(Mutex::new(writer)))))
    }

    pub fn write(&self, line: std::fmt::Arguments<'_>) {
        if let Ok(mut w) = self.0.lock() {
            let _ = w.write_fmt(line);
            let _ = w.write_all(b"\n");
        }
    }
}
