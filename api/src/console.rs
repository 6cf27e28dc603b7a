//! The web console: static files embedded in the binary, served by every node at `/`.
//!
//! | route | what |
//! |---|---|
//! | `GET /` | the console page (`api/console/index.html`) |
//! | `GET /console/{file}` | its script and style sheet |
//!
//! The files need no token; the page asks for one and sends it as `Authorization: Bearer`
//! on every API call it makes, so the console can do exactly what the token can. Every
//! answer carries the console's strict policy ([`crate::headers::console`]: scripts and styles
//! from this node only, no inline script or style, API calls to this node only, no framing,
//! no plugins). The script builds the page with DOM nodes and `textContent`, never HTML from
//! server data.

use crate::ApiError;
use axum::extract::Path;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("../console/index.html");

/// The files under `/console/`: name, content type, content.
const ASSETS: [(&str, &str, &str); 3] = [
    ("app.js", "text/javascript; charset=utf-8", include_str!("../console/app.js")),
    ("style.css", "text/css; charset=utf-8", include_str!("../console/style.css")),
    ("icon.svg", "image/svg+xml", include_str!("../console/icon.svg")),
];

fn page(content_type: &'static str, body: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        // The files change with the binary: never run an old script.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store, max-age=0")),
    ];
    (headers, body).into_response()
}

/// `GET /`: the console page.
pub async fn index() -> Response {
    page("text/html; charset=utf-8", INDEX_HTML)
}

/// `GET /console/{file}`: one of the console's files, else 404.
pub async fn asset(Path(file): Path<String>) -> Result<Response, ApiError> {
    ASSETS
        .iter()
        .find(|(name, _, _)| *name == file)
        .map(|(_, content_type, body)| page(content_type, body))
        .ok_or_else(|| ApiError::NotFound(format!("no console file {file:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_files_and_nothing_inline() {
        for (name, _, _) in ASSETS {
            assert!(INDEX_HTML.contains(&format!("\"/console/{name}\"")), "index.html does not load {name}");
        }
        // No inline script or style, no handler attributes: the policy would refuse them.
        for forbidden in ["<script>", "style=", "onclick", "onload", "javascript:"] {
            assert!(!INDEX_HTML.contains(forbidden), "index.html holds {forbidden:?}");
        }
        // The script never parses server data as HTML.
        let script = ASSETS[0].2;
        for forbidden in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("] {
            assert!(!script.contains(forbidden), "app.js uses {forbidden}");
        }
    }
}
