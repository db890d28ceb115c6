//! TLS for the gRPC carrier, through tonic's rustls support (ring provider).
//!
//! ```text
//! learner  ServerTls::from_files(cert chain, key, client CA?) ─► grpc::serve_with(.., Some(&tls))
//! actor    ClientTls::from_files(CA, own cert + key?)         ─► GrpcClient::connect_with(.., Some(&tls))
//! ```
//!
//! Files are read and checked here, when these are built, so a missing file, one that holds no PEM block of
//! the expected kind, or a key that is not the certificate's is an error naming the file before anything
//! listens or connects. With a client CA (mutual TLS) the learner accepts only clients whose certificate that
//! CA signed. The run token is checked over TLS as over plaintext.
use std::path::Path;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};

use crate::error::RpcError;

/// A TLS handshake that has not finished after this long is dropped (a client that connected and went quiet,
/// or a plaintext client waiting for an answer to its HTTP/2 preface).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The learner's side: its certificate chain and key, and optionally the CA whose client certificates it
/// requires (mutual TLS).
#[derive(Debug, Clone)]
pub struct ServerTls {
    identity: Identity,
    client_ca: Option<Certificate>,
}

impl ServerTls {
    /// Read the learner's PEM certificate chain `cert` and private key `key`, and, for mutual TLS, the PEM CA
    /// certificate(s) `client_ca` that must have signed every client's certificate. Errors name the file: one
    /// that cannot be read, one without a certificate (or key), or a key that does not match the certificate.
    pub fn from_files(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Self, RpcError> {
        let identity = read_identity(cert, key, "the learner's")?;
        let client_ca = client_ca.map(|p| read_certificates(p, "the client CA's")).transpose()?;
        let tls = ServerTls { identity, client_ca };
        // tonic builds rustls' server config here: this is where a key that is not the certificate's shows.
        Server::builder().tls_config(tls.config()).map_err(|e| unusable(cert, key, &e))?;
        Ok(tls)
    }

    /// Whether clients must present a certificate signed by the client CA.
    pub fn requires_client_certificates(&self) -> bool {
        self.client_ca.is_some()
    }

    pub(crate) fn config(&self) -> ServerTlsConfig {
        let config = ServerTlsConfig::new().identity(self.identity.clone()).timeout(HANDSHAKE_TIMEOUT);
        match &self.client_ca {
            Some(ca) => config.client_ca_root(ca.clone()),
            None => config,
        }
    }
}

/// An actor's side: the CA that signed the learner's certificate, optionally the actor's own certificate and
/// key (the learner asks for one under mutual TLS), and the name the learner's certificate must carry.
#[derive(Debug, Clone)]
pub struct ClientTls {
    ca: Certificate,
    identity: Option<Identity>,
    domain: Option<String>,
}

impl ClientTls {
    /// Read the PEM CA certificate(s) `ca` that the learner's certificate must chain to and, for mutual TLS,
    /// the actor's own PEM certificate and key. Errors name the file, as for [`ServerTls::from_files`].
    pub fn from_files(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<Self, RpcError> {
        let ca = read_certificates(ca, "the CA's")?;
        let tls = match identity {
            None => ClientTls { ca, identity: None, domain: None },
            Some((cert, key)) => {
                let tls = ClientTls { ca, identity: Some(read_identity(cert, key, "the actor's")?), domain: None };
                // tonic builds rustls' client config here: a key that is not the certificate's shows.
                Endpoint::from_static("https://localhost")
                    .tls_config(tls.config())
                    .map_err(|e| unusable(cert, key, &e))?;
                tls
            }
        };
        Ok(tls)
    }

    /// Check the learner's certificate against `name` instead of the host in the address connected to (for a
    /// learner reached by an IP address or an alias its certificate does not list).
    pub fn with_domain(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }

    pub(crate) fn config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new().ca_certificate(self.ca.clone()).timeout(HANDSHAKE_TIMEOUT);
        if let Some(identity) = &self.identity {
            config = config.identity(identity.clone());
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        config
    }
}

/// Every message in an error's chain of sources, joined by ": " (tonic's own message is often just
/// "transport error"; rustls' reason, such as an unknown issuer or an expired certificate, is further down).
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// Why rustls would not take a certificate and key that are each valid PEM: most often the key is another
/// certificate's; otherwise rustls' reason (a version-1 certificate, an unsupported key type).
fn unusable(cert: &Path, key: &Path, e: &(dyn std::error::Error + 'static)) -> RpcError {
    let why = error_chain(e);
    let (cert, key) = (cert.display(), key.display());
    if why.contains("KeyMismatch") {
        RpcError::invalid(format!("TLS key {key} does not match certificate {cert}: it is another certificate's key"))
    } else if why.contains("UnsupportedCertVersion") {
        RpcError::invalid(format!(
            "TLS certificate {cert} is an X.509 version 1 certificate, which rustls refuses ({why}); `openssl x509 \
             -req` writes version 3 when given extensions, e.g. -extfile <(printf subjectAltName=DNS:NAME)"
        ))
    } else {
        RpcError::invalid(format!("TLS certificate {cert} with key {key} cannot be used: {why}"))
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, RpcError> {
    std::fs::read(path).map_err(|e| RpcError::invalid(format!("{what} {}: cannot read it: {e}", path.display())))
}

/// The PEM certificates in `path` (at least one); `whose` starts the messages ("the CA's").
fn read_certificates(path: &Path, whose: &str) -> Result<Certificate, RpcError> {
    let what = format!("{whose} TLS certificate");
    let pem = read(path, &what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RpcError::invalid(format!("{what} {}: not valid PEM: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(RpcError::invalid(format!(
            "{what} {}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)",
            path.display()
        )));
    }
    Ok(Certificate::from_pem(pem))
}

/// A certificate chain and its private key, each checked to be PEM of its kind.
fn read_identity(cert: &Path, key: &Path, whose: &str) -> Result<Identity, RpcError> {
    let chain = read_certificates(cert, whose)?;
    let what = format!("{whose} TLS key");
    let key_pem = read(key, &what)?;
    PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        RpcError::invalid(format!("{what} {}: no PEM private key in it (PKCS#8, PKCS#1 or SEC1): {e}", key.display()))
    })?;
    Ok(Identity::from_pem(chain.into_inner(), key_pem))
}
