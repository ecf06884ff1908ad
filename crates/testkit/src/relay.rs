//! A TCP relay to a server that a test can cut (listener closed, every relayed connection
//! closed) and restore on the same port: the server "goes away" for its clients without
//! stopping, and whatever they had sent it by then still reaches it.

use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// A relay on `127.0.0.1`, running on the current tokio runtime.
#[derive(Debug)]
pub struct Relay {
    pub addr: SocketAddr,
    target: SocketAddr,
    task: Option<JoinHandle<()>>,
}

impl Relay {
    /// A relay to `target` on a free port.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        Ok(Self {
            addr,
            target,
            task: Some(tokio::spawn(relay(listener, target))),
        })
    }

    /// The server "goes down": new connections are refused, open ones are closed.
    pub async fn cut(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// The server "comes back" on the same address.
    pub async fn restore(&mut self) -> std::io::Result<()> {
        let listener = TcpListener::bind(self.addr).await?;
        self.task = Some(tokio::spawn(relay(listener, self.target)));
        Ok(())
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Relays every accepted connection; aborting this task drops the listener and the
/// `JoinSet`, which aborts (and so closes) every relayed connection.
async fn relay(listener: TcpListener, target: SocketAddr) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((mut inbound, _)) = accepted else { continue };
                connections.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
            Some(_) = connections.join_next() => {}
        }
    }
}
