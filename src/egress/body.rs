//! Body types of the proxy, and the two wrappers the request path puts around bodies:
//! request bodies whose trailers are checked for placeholders, and response bodies whose
//! trailers (and, where asked, data) are scrubbed of the secrets the request carried.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Body, Frame, SizeHint};

use crate::credentials::apply::trailers_mention_placeholder;
use crate::credentials::scrub::{scrub_headers, Scrubber, StreamScrub};
use crate::error::Error;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ProxyBody = BoxBody<Bytes, BoxError>;

pub(crate) fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// The proxy's response writer: a refusal or failure as the error shape (407 for missing
/// proxy credentials), the one place the egress path turns an [`Error`] into HTTP.
pub(crate) fn reply(error: &Error) -> http::Response<ProxyBody> {
    crate::reply::render::<Full<Bytes>>(crate::reply::proxy_status(error.kind), error)
        .map(|b| b.map_err(|never| match never {}).boxed())
}

/// The next frame of a wrapped body, its error boxed.
fn poll_inner<B>(
    inner: &mut B,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    Pin::new(inner)
        .poll_frame(cx)
        .map(|frame| frame.map(|r| r.map_err(Into::into)))
}

/// Called once when a request's trailers carry a placeholder (to record the refusal).
pub(crate) type OnRefusal = Box<dyn FnOnce() + Send + Sync>;

/// A request body passed through as it streams, except that trailers carrying a
/// placeholder end it with an error instead: the upstream gets an aborted request (h2
/// `RST_STREAM`, an unfinished h1 chunked body), never the trailer.
pub(crate) struct GuardedRequest<B> {
    inner: B,
    on_refusal: Option<OnRefusal>,
}

impl<B> GuardedRequest<B> {
    pub fn new(inner: B, on_refusal: OnRefusal) -> Self {
        GuardedRequest {
            inner,
            on_refusal: Some(on_refusal),
        }
    }
}

impl<B> Body for GuardedRequest<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            None => return Poll::Ready(None),
        };
        if frame
            .trailers_ref()
            .is_some_and(trailers_mention_placeholder)
        {
            if let Some(on_refusal) = this.on_refusal.take() {
                on_refusal();
            }
            return Poll::Ready(Some(Err(
                "a request trailer carries a credential placeholder; the request was aborted"
                    .into(),
            )));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body in S3's signed `aws-chunked` form, each chunk signed again as it passes
/// (see `credentials::aws_chunked`); a framing error aborts the upload instead of
/// forwarding part of it.
pub(crate) struct ResignedChunks<B> {
    inner: B,
    resigner: crate::credentials::aws_chunked::ChunkResigner,
    done: bool,
}

impl<B> ResignedChunks<B> {
    pub fn new(inner: B, resigner: crate::credentials::aws_chunked::ChunkResigner) -> Self {
        ResignedChunks {
            inner,
            resigner,
            done: false,
        }
    }
}

impl<B> Body for ResignedChunks<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    this.done = true;
                    return Poll::Ready(this.resigner.finish().err().map(|e| Err(e.into())));
                }
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                // HTTP trailers (not aws-chunked ones) pass as they are.
                Err(frame) => return Poll::Ready(Some(Ok(frame))),
            };
            match this.resigner.push(&data) {
                Ok(out) if out.is_empty() => continue,
                Ok(out) => return Poll::Ready(Some(Ok(Frame::data(out)))),
                Err(e) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        // Re-signing keeps the length exactly.
        self.inner.size_hint()
    }
}

/// A response body whose trailers are scrubbed, and whose data is too when `stream` is set.
pub(crate) struct ScrubbedResponse<B> {
    inner: B,
    scrubbers: Vec<Arc<Scrubber>>,
    stream: Option<StreamScrub>,
    pending_trailers: Option<HeaderMap>,
    ended: bool,
}

impl<B> ScrubbedResponse<B> {
    pub fn new(inner: B, scrubbers: Vec<Arc<Scrubber>>, scrub_data: bool) -> Self {
        let stream = scrub_data.then(|| StreamScrub::new(scrubbers.clone()));
        ScrubbedResponse {
            inner,
            scrubbers,
            stream,
            pending_trailers: None,
            ended: false,
        }
    }

    /// The data still held by the stream scrubber, at the end of the body.
    fn flush(&mut self) -> Option<Bytes> {
        let rest = self.stream.as_mut()?.finish();
        (!rest.is_empty()).then_some(rest)
    }
}

impl<B> Body for ScrubbedResponse<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if this.ended {
                return Poll::Ready(this.pending_trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            let frame = match ready!(poll_inner(&mut this.inner, cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.ended = true;
                    if let Some(rest) = this.flush() {
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                    continue;
                }
            };
            let frame = match frame.into_data() {
                Ok(data) => match &mut this.stream {
                    Some(stream) => {
                        let clean = stream.push(&data);
                        if clean.is_empty() {
                            continue;
                        }
                        return Poll::Ready(Some(Ok(Frame::data(clean))));
                    }
                    None => return Poll::Ready(Some(Ok(Frame::data(data)))),
                },
                Err(frame) => frame,
            };
            if let Ok(mut trailers) = frame.into_trailers() {
                scrub_headers(&mut trailers, &this.scrubbers);
                // Trailers come last: what the scrubber still holds goes out first.
                this.ended = true;
                this.pending_trailers = Some(trailers);
                if let Some(rest) = this.flush() {
                    return Poll::Ready(Some(Ok(Frame::data(rest))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        let nothing_pending = self.pending_trailers.is_none();
        (self.ended && nothing_pending)
            || (self.stream.is_none() && nothing_pending && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match self.stream {
            Some(_) => SizeHint::default(),
            None => self.inner.size_hint(),
        }
    }
}
