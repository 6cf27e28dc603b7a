//! Security headers, set by `tower-http`'s header layers on whole routers (never by a
//! handler), so no answer leaves without them:
//!
//! - **Every answer** ([`everywhere`]): `X-Content-Type-Options: nosniff`,
//!   `Referrer-Policy: no-referrer`, `Cross-Origin-Resource-Policy: same-origin` (no other
//!   site embeds or reads what a node serves), `X-Permitted-Cross-Domain-Policies: none`,
//!   `X-XSS-Protection: 0` (the old filters did harm), a `Permissions-Policy` granting no
//!   device; and, unless its router set its own, `Content-Security-Policy: default-src 'none';
//!   frame-ancestors 'none'`, `X-Frame-Options: DENY` (an API answer is data: nothing in it
//!   may run, load or be framed) and `Cache-Control: no-store, max-age=0` (answers carry a
//!   user's data; no proxy or shared browser keeps them).
//! - **The console's pages** ([`console`]): [`CONSOLE_POLICY`] — scripts, styles and calls
//!   from this node only, nothing inline, no framing — and `Cross-Origin-Opener-Policy`.
//! - **A user's files** ([`user_content`]: WebDAV, share links, whole-file and block
//!   downloads): [`USER_CONTENT_POLICY`], so an HTML or SVG file opened in a browser runs no
//!   script, loads nothing and lives in an opaque origin, never the console's (whose page
//!   holds a token); and `Content-Disposition: attachment` on a file of any type but those a
//!   browser shows without running anything ([`shown_inline`]).

use axum::body::Body;
use axum::http::{header, HeaderName, HeaderValue, Response};
use axum::Router;
use tower::ServiceBuilder;
use tower_http::set_header::SetResponseHeaderLayer;

use crate::AppState;

/// The policy of every answer that sets none of its own.
pub const API_POLICY: &str = "default-src 'none'; frame-ancestors 'none'";
/// The console's policy: everything from this origin only, nothing inline, no framing.
pub const CONSOLE_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
/// Devices no page of a node may use.
pub const PERMISSIONS_POLICY: &str = "camera=(), microphone=(), geolocation=(), payment=(), usb=()";
/// A user's file: a sandbox (an opaque origin, no script, no forms, no popups) that loads
/// nothing and is framed by nobody.
pub const USER_CONTENT_POLICY: &str = "sandbox; default-src 'none'; frame-ancestors 'none'";

/// Whether a browser shows a file of this type without running anything in it: images but
/// SVG, audio, video, plain text. Every other type is sent as an attachment.
pub fn shown_inline(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let (kind, sub) = essence.split_once('/').unwrap_or((essence.as_str(), ""));
    match kind {
        "audio" | "video" => true,
        "image" => matches!(sub, "png" | "jpeg" | "gif" | "webp" | "avif" | "bmp"),
        "text" => sub == "plain",
        _ => false,
    }
}

/// `attachment` for a file (a 200 or 206 with a type) that is not [`shown_inline`].
fn disposition<B>(response: &Response<B>) -> Option<HeaderValue> {
    let status = response.status().as_u16();
    let content_type = response.headers().get(header::CONTENT_TYPE)?.to_str().unwrap_or("");
    ((status == 200 || status == 206) && !shown_inline(content_type)).then(|| HeaderValue::from_static("attachment"))
}

// Each policy is one `ServiceBuilder` stack applied with one `Router::layer`: axum boxes
// every route once per `layer` call (a profile of commits at 256 clients showed zeroed
// allocations of the nested boxed futures at the top).

/// The layers of [`user_content`] on `router`.
pub fn user_content(router: Router<AppState>) -> Router<AppState> {
    router.layer(
        ServiceBuilder::new()
            .layer(SetResponseHeaderLayer::if_not_present(header::CONTENT_DISPOSITION, disposition::<Body>))
            .layer(SetResponseHeaderLayer::overriding(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(USER_CONTENT_POLICY),
            )),
    )
}

/// The layers of [`console`] on `router`.
pub fn console(router: Router<AppState>) -> Router<AppState> {
    router.layer(
        ServiceBuilder::new()
            .layer(SetResponseHeaderLayer::overriding(
                HeaderName::from_static("cross-origin-opener-policy"),
                HeaderValue::from_static("same-origin"),
            ))
            .layer(SetResponseHeaderLayer::overriding(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CONSOLE_POLICY),
            )),
    )
}

/// The layers every answer passes ([`everywhere`]), on the whole router.
pub fn everywhere(router: Router) -> Router {
    let always = |name: HeaderName, value: &'static str| {
        SetResponseHeaderLayer::overriding(name, HeaderValue::from_static(value))
    };
    let unless_set = |name: HeaderName, value: &'static str| {
        SetResponseHeaderLayer::if_not_present(name, HeaderValue::from_static(value))
    };
    router.layer(
        ServiceBuilder::new()
            .layer(always(HeaderName::from_static("permissions-policy"), PERMISSIONS_POLICY))
            .layer(always(header::X_XSS_PROTECTION, "0"))
            .layer(always(HeaderName::from_static("x-permitted-cross-domain-policies"), "none"))
            .layer(always(HeaderName::from_static("cross-origin-resource-policy"), "same-origin"))
            .layer(always(header::REFERRER_POLICY, "no-referrer"))
            .layer(always(header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
            .layer(unless_set(header::CACHE_CONTROL, "no-store, max-age=0"))
            .layer(unless_set(header::X_FRAME_OPTIONS, "DENY"))
            .layer(unless_set(header::CONTENT_SECURITY_POLICY, API_POLICY)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_types_that_run_nothing_are_shown_inline() {
        for inline in ["image/png", "IMAGE/JPEG", "text/plain; charset=utf-8", "video/mp4", "audio/ogg"] {
            assert!(shown_inline(inline), "{inline}");
        }
        for attached in [
            "text/html",
            "text/html; charset=utf-8",
            "image/svg+xml",
            "application/xhtml+xml",
            "text/xml",
            "application/xml",
            "application/javascript",
            "text/javascript",
            "application/pdf",
            "application/octet-stream",
            "multipart/x-mixed-replace",
            "",
            "garbage",
        ] {
            assert!(!shown_inline(attached), "{attached}");
        }
    }
}
