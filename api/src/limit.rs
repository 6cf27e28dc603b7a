//! The front door's connection cap (`[http] connections_max`), as mini-redis's
//! `MAX_CONNECTIONS`: a listener that takes a place from a semaphore before it accepts, and a
//! connection that gives it back when it closes. Beyond the cap, new connections wait in the
//! kernel's backlog; the requests-in-flight cap (`lib.rs`, `admit`) answers 503 instead.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A listener accepting at most `max` connections open at once.
pub struct Limited<L> {
    inner: L,
    places: Arc<Semaphore>,
}

impl<L> Limited<L> {
    pub fn new(inner: L, max: usize) -> Limited<L> {
        Limited { inner, places: Arc::new(Semaphore::new(max.max(1))) }
    }
}

impl<L: Listener> Listener for Limited<L> {
    type Io = Counted<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // The semaphore is never closed, so a place always comes.
        let place = self.places.clone().acquire_owned().await.ok();
        let (io, addr) = self.inner.accept().await;
        (Counted { io, _place: place }, addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// An accepted connection holding its place until it is dropped.
pub struct Counted<Io> {
    io: Io,
    _place: Option<OwnedSemaphorePermit>,
}

impl<Io> Counted<Io> {
    /// The connection itself.
    pub fn inner(&self) -> &Io {
        &self.io
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for Counted<Io> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Counted<Io> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_beyond_the_cap_waits_until_one_closes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut limited = Limited::new(listener, 1);
        let _first = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (held, _) = limited.accept().await;
        let _second = tokio::net::TcpStream::connect(addr).await.expect("connect (the backlog takes it)");
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(200), limited.accept()).await;
        assert!(waiting.is_err(), "a second connection was accepted past the cap");
        drop(held);
        let accepted = tokio::time::timeout(std::time::Duration::from_secs(5), limited.accept()).await;
        assert!(accepted.is_ok(), "the second connection was not accepted once the first closed");
    }
}
