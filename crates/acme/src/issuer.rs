//! One order, from new-order to the certificate chain (RFC 8555 section 7.4): every
//! authorization proven by the configured challenge (published in [`Challenges`], and in
//! a fleet's store for the other instances, while the CA validates; withdrawn after,
//! whatever the outcome), then a key made here and its CSR finalized.

use std::sync::Arc;
use std::time::Duration;

use instant_acme::{
    Account, AuthorizationStatus, CertificateIdentifier, ChallengeType, Identifier, NewOrder,
    Order, OrderStatus, RetryPolicy,
};
use zeroize::Zeroizing;

use crate::challenges::{Challenges, Published, Whose};
use crate::fleet::{Answer, FleetStore};
use crate::settings::{AcmeSettings, ChallengeKind};
use crate::store::CertKind;

/// How long an order may take to be validated, and then to be issued.
const VALIDATION: Duration = Duration::from_secs(90);

/// A certificate just issued: its key, then its chain, PEM, as the state directory and
/// the fleet's store keep it (zeroed when dropped).
pub(crate) struct Issued(pub(crate) Zeroizing<String>);

/// Why an order failed, and when the CA asked to be tried again.
#[derive(Debug)]
pub(crate) struct OrderError {
    pub(crate) message: String,
    pub(crate) retry_after: Option<Duration>,
}

impl std::fmt::Display for OrderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<instant_acme::Error> for OrderError {
    fn from(e: instant_acme::Error) -> Self {
        let retry_after = match &e {
            instant_acme::Error::Timeout(Some(at)) => {
                Some(at.saturating_duration_since(std::time::Instant::now()))
            }
            _ => None,
        };
        let message = match &e {
            instant_acme::Error::Api(problem) => describe(problem),
            other => other.to_string(),
        };
        Self {
            message,
            retry_after,
        }
    }
}

fn describe(problem: &instant_acme::Problem) -> String {
    let mut text = format!(
        "{} {}",
        problem.r#type.as_deref().unwrap_or("error"),
        problem.detail.as_deref().unwrap_or("")
    );
    for sub in &problem.subproblems {
        text.push_str(&format!(
            "; {}",
            sub.detail.as_deref().unwrap_or("(no detail)")
        ));
    }
    text
}

/// Whether `e` refuses only the order's `replaces` (RFC 9773 section 5).
fn replaced_refused(e: &instant_acme::Error) -> bool {
    match e {
        instant_acme::Error::Unsupported(_) => true,
        instant_acme::Error::Api(p) => p
            .r#type
            .as_deref()
            .is_some_and(|t| t.ends_with(":alreadyReplaced") || t.ends_with(":malformed")),
        _ => false,
    }
}

fn failed(message: impl Into<String>) -> OrderError {
    OrderError {
        message: message.into(),
        retry_after: None,
    }
}

/// Orders a certificate of `kind` for `names`, replacing `replaces` where the CA has ARI.
/// With `fleet`, the challenge answers are shared with every instance first.
pub(crate) async fn issue(
    account: &Account,
    settings: &AcmeSettings,
    challenges: &Arc<Challenges>,
    fleet: Option<&FleetStore>,
    names: &[String],
    kind: CertKind,
    replaces: Option<CertificateIdentifier<'static>>,
) -> Result<Issued, OrderError> {
    let identifiers: Vec<Identifier> = names.iter().map(|n| Identifier::Dns(n.clone())).collect();
    let new = || {
        let order = NewOrder::new(&identifiers);
        match &settings.profile {
            Some(profile) => order.profile(profile),
            None => order,
        }
    };
    let mut order = match replaces {
        Some(old) => {
            match account.new_order(&new().replaces(old)).await {
                Ok(order) => order,
                // A CA without ARI, or one that will not link this order to the old
                // certificate (already replaced): an order of its own. Any other
                // refusal (a rate limit, the CA down) is the order's failure, retried
                // later.
                Err(e) if replaced_refused(&e) => {
                    tracing::debug!("acme: order replacing the previous certificate refused ({e}); ordering anew");
                    account.new_order(&new()).await?
                }
                Err(e) => return Err(e.into()),
            }
        }
        None => account.new_order(&new()).await?,
    };
    // Answered until the order is decided, whatever the outcome: the CA may validate
    // from several places, more than once.
    let mut answers = Answers::default();
    let proven = prove(&mut order, settings, challenges, fleet, &mut answers).await;
    if let Some(fleet) = fleet {
        fleet.withdraw(&answers.shared).await;
    }
    drop(answers);
    let status = proven?;
    if status != OrderStatus::Ready {
        let why = order
            .state()
            .error
            .as_ref()
            .map_or_else(|| format!("order {status:?}"), describe);
        return Err(failed(why));
    }
    let key = match kind {
        CertKind::Rsa2048 => {
            rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
        }
        CertKind::EcdsaP256 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
    }
    .map_err(|e| failed(format!("{} key: {e}", kind.name())))?;
    let params =
        rcgen::CertificateParams::new(names.to_vec()).map_err(|e| failed(format!("CSR: {e}")))?;
    let csr = params
        .serialize_request(&key)
        .map_err(|e| failed(format!("CSR: {e}")))?;
    order.finalize_csr(csr.der()).await?;
    let chain = order.poll_certificate(&retries()).await?;
    let key_pem = Zeroizing::new(key.serialize_pem());
    let key_pem = key_pem.trim_end();
    // Sized at once: a buffer that grew would leave a copy of the key behind, unzeroed.
    let mut file = Zeroizing::new(String::with_capacity(key_pem.len() + 1 + chain.len()));
    file.push_str(key_pem);
    file.push('\n');
    file.push_str(&chain);
    Ok(Issued(file))
}

/// The answers an order published: here (withdrawn on drop) and in the fleet's store.
#[derive(Default)]
struct Answers {
    here: Vec<Published>,
    shared: Vec<Answer>,
}

/// Every pending authorization's challenge answered, the CA told, and its verdict
/// awaited. Answers go out first, all of them, and the CA is told only once every
/// instance can give them: another instance reads the store every `poll`.
async fn prove(
    order: &mut Order,
    settings: &AcmeSettings,
    challenges: &Arc<Challenges>,
    fleet: Option<&FleetStore>,
    answers: &mut Answers,
) -> Result<OrderStatus, OrderError> {
    let challenge_type = match settings.challenge {
        ChallengeKind::Http01 => ChallengeType::Http01,
        ChallengeKind::TlsAlpn01 => ChallengeType::TlsAlpn01,
    };
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz?;
        match authz.status {
            AuthorizationStatus::Valid => continue,
            AuthorizationStatus::Pending => {}
            other => return Err(failed(format!("authorization {other:?}"))),
        }
        let name = authz.identifier().to_string();
        let challenge = authz.challenge(challenge_type.clone()).ok_or_else(|| {
            failed(format!(
                "the CA offers no {} challenge for {name}",
                settings.challenge.name()
            ))
        })?;
        let answer = match settings.challenge {
            ChallengeKind::Http01 => Answer::Http01(challenge.token.clone()),
            ChallengeKind::TlsAlpn01 => Answer::TlsAlpn01(name),
        };
        let key_authorization = challenge.key_authorization();
        answers.here.extend(
            answer
                .publish(challenges, key_authorization.as_str(), Whose::Ours)
                .map_err(|e| failed(e.to_string()))?,
        );
        if let Some(fleet) = fleet {
            fleet
                .publish(&answer, key_authorization.as_str())
                .await
                .map_err(|e| failed(e.to_string()))?;
            answers.shared.push(answer);
        }
    }
    if let (Some(fleet), false) = (fleet, answers.shared.is_empty()) {
        tokio::time::sleep(fleet.look * 2 + Duration::from_millis(250)).await;
    }
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz?;
        if authz.status != AuthorizationStatus::Pending {
            continue;
        }
        if let Some(mut challenge) = authz.challenge(challenge_type.clone()) {
            challenge.set_ready().await?;
        }
    }
    Ok(order.poll_ready(&retries()).await?)
}

/// How an order's state is polled: soon, then as the CA's Retry-After says, for at most
/// [`VALIDATION`].
fn retries() -> RetryPolicy {
    RetryPolicy::new()
        .initial_delay(Duration::from_millis(250))
        .timeout(VALIDATION)
}
