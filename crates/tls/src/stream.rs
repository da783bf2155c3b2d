//! One stream type for plain and TLS connections.
//!
//! An enum, not a generic parameter: connection code (the shard's frame
//! loop, the backup service, the coordinator, the client's RPC tasks) stays
//! one concrete function, and the plain path costs one predictable branch
//! per read or write. TLS variants are boxed because a rustls connection is
//! ~1 KiB and most streams are plain.
//!
//! Writers must `flush` after `write_all`: a TLS stream may hold encrypted
//! records that the socket did not take yet (for plain TCP flush is free).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

pub enum Stream {
    Plain(TcpStream),
    /// Accepted by a listener (`ServerTls::accept`).
    Server(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// Dialled (`ClientTls::connect`).
    Client(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Stream {
    pub fn is_tls(&self) -> bool {
        !matches!(self, Stream::Plain(_))
    }

    /// The TCP socket underneath (for options and addresses).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Server(s) => s.get_ref().0,
            Stream::Client(s) => s.get_ref().0,
        }
    }

    /// Halves a reader task and a writer task can own. A plain socket
    /// splits without a lock; a TLS session is one state machine for both
    /// directions, so its halves share it through tokio's split lock.
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Plain(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Plain(r), WriteHalf::Plain(w))
            }
            tls => {
                let (r, w) = tokio::io::split(tls);
                (ReadHalf::Tls(r), WriteHalf::Tls(w))
            }
        }
    }
}

/// Implements `AsyncRead` or `AsyncWrite` for an enum of streams (its
/// variants listed) by forwarding each call to the stream inside the
/// variant: one match per call, no `dyn` (see the module note). A boxed TLS
/// stream forwards through tokio's `Box` impl.
macro_rules! forward_io {
    (@call $this:expr, $ty:ident, [$($variant:ident),+], $poll:ident $args:tt) => {
        match $this {
            $($ty::$variant(s) => Pin::new(s).$poll $args,)+
        }
    };
    (AsyncRead for $ty:ident $variants:tt) => {
        impl AsyncRead for $ty {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                forward_io!(@call self.get_mut(), $ty, $variants, poll_read(cx, buf))
            }
        }
    };
    (AsyncWrite for $ty:ident $variants:tt) => {
        impl AsyncWrite for $ty {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                forward_io!(@call self.get_mut(), $ty, $variants, poll_write(cx, buf))
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                forward_io!(@call self.get_mut(), $ty, $variants, poll_flush(cx))
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                forward_io!(@call self.get_mut(), $ty, $variants, poll_shutdown(cx))
            }
        }
    };
}

forward_io!(AsyncRead for Stream [Plain, Server, Client]);
forward_io!(AsyncWrite for Stream [Plain, Server, Client]);

/// The reading half of a `Stream`.
pub enum ReadHalf {
    Plain(OwnedReadHalf),
    Tls(tokio::io::ReadHalf<Stream>),
}

/// The writing half of a `Stream`.
pub enum WriteHalf {
    Plain(OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<Stream>),
}

forward_io!(AsyncRead for ReadHalf [Plain, Tls]);
forward_io!(AsyncWrite for WriteHalf [Plain, Tls]);
