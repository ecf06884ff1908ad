//! `CONNECT host:port`: a tunnel through the leased upstream. The outcome is the tunnel's
//! setup (the gateway cannot see inside TLS): failure, timeout or success with the setup time.
//! The lease is held for the tunnel's life, so active leases count open tunnels; clients
//! report what they saw inside through `POST /v1/feedback`.

use super::report::release_now;
use super::{Gateway, GatewayBody, Target, reply};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use proxypool::dial::{DialError, tunnel as dial_tunnel};
use proxypool::{Lease, Outcome};
use std::time::Instant;
use tokio::io::AsyncWriteExt;

pub(super) async fn tunnel(
    gw: &Gateway,
    request: Request<Incoming>,
    target: &Target,
    lease: Lease,
    started: Instant,
) -> (Response<GatewayBody>, &'static str) {
    let opened = match gw.upstream(lease.address()) {
        Ok(upstream) => {
            dial_tunnel(
                &upstream,
                &target.host,
                target.port,
                gw.settings.connect_timeout,
            )
            .await
        }
        Err(e) => Err(e),
    };
    let (mut upstream, leftover) = match opened {
        Ok(opened) => opened,
        Err(e) => return upstream_failed(lease, &e),
    };
    let latency = started.elapsed();
    let mut request = request;
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let mut client = TokioIo::new(upgraded);
                let copied = async {
                    if !leftover.is_empty() {
                        client.write_all(&leftover).await?;
                    }
                    tokio::io::copy_bidirectional(&mut client, &mut upstream).await
                }
                .await;
                if let Err(e) = copied {
                    tracing::debug!(error = %e, "tunnel ended with an error");
                }
            }
            Err(e) => tracing::debug!(error = %e, "client left before the tunnel opened"),
        }
        // The upstream opened the tunnel: that is its success, however the tunnel ended.
        release_now(lease, Outcome::Success { latency });
    });
    (Response::new(Either::Left(Full::default())), "ok")
}

/// Reports the failure and tells the client which kind it was.
pub(super) fn upstream_failed(
    lease: Lease,
    e: &DialError,
) -> (Response<GatewayBody>, &'static str) {
    let outcome = e.outcome();
    let upstream = lease.address().to_string();
    release_now(lease, outcome);
    let message = format!("upstream {upstream}: {e}");
    match outcome {
        Outcome::Timeout => (
            reply::error(StatusCode::GATEWAY_TIMEOUT, "upstream-timeout", &message),
            "upstream_timeout",
        ),
        _ => (
            reply::error(StatusCode::BAD_GATEWAY, "upstream-failed", &message),
            "upstream_failed",
        ),
    }
}
