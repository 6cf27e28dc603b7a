//! What a WebDAV request hands `dav-server`, read and checked here first, once:
//!
//! - **The body** of every method but PUT (the library reads those whole, at most
//!   [`BODY_BYTES_MAX`]) is read here, each piece within the transfers' idle bound, and an
//!   XML body nesting deeper than [`XML_DEPTH_MAX`] is refused (400) before any tree is
//!   built: the library's tree builder (`xmltree`) recurses once per element on a worker's
//!   stack, and 21,000 nested elements in 63 KB overflowed it and killed the node. The depth
//!   is counted on the same parser's events (the `xml` crate, configured as `xmltree` does),
//!   so what passes here nests no deeper there.
//! - **`Destination`** is parsed by [`destination`] alone; the request goes on with the header
//!   rewritten to the path it found, percent-encoded, so the library reads that path and no
//!   other (a second parser once read `x\..\Shared` as `/Shared` where the check had read a
//!   file name, and the MOVE deleted a shared folder's files).
//! - **`If`** is parsed by [`if_header`] (RFC 4918 10.4, bounded) and handed on rebuilt from
//!   what was parsed: the library's own scanner reads past the end of an unclosed `[` or `<`
//!   and panics (the fuzz target `dav_request` found it), so it only ever reads well-formed
//!   lists this node wrote. **`If-Match`, `If-None-Match` and `If-Range`** likewise
//!   ([`etags`]): the library slices a lone `"` as an entity tag and panics (`scripts/fuzz`
//!   found it).

use axum::body::{Body, Bytes};
use axum::http::HeaderValue;
use dav_server::davpath::DavPath;
use futures_util::StreamExt as _;
use xml::reader::XmlEvent;

use crate::ApiError;

/// Bytes of a body `dav-server` reads whole (its own bound, for every method but PUT and
/// PATCH); a longer one is 413.
pub const BODY_BYTES_MAX: usize = 64 * 1024;
/// Elements open at once in an XML body, at most: PROPFIND, LOCK and PROPPATCH bodies nest
/// five or six deep; a dead property's value may add its own few.
pub const XML_DEPTH_MAX: usize = 32;
/// Bytes of a `Destination` header, at most.
pub const DESTINATION_BYTES_MAX: usize = 8 * 1024;
/// Where WebDAV is served: every `Destination` must name a path under it.
pub const PREFIX: &str = "/dav";
/// Bytes of an `If` header, at most.
pub const IF_BYTES_MAX: usize = 8 * 1024;
/// Lists in an `If` header, and conditions in one list, at most.
pub const IF_LISTS_MAX: usize = 32;
pub const IF_CONDITIONS_MAX: usize = 32;

/// The body of a request for `dav-server`, read whole: at most [`BODY_BYTES_MAX`] bytes (413
/// beyond), an XML body at most [`XML_DEPTH_MAX`] deep (400 beyond). Each piece must come
/// within the idle bound the router sets on transfers' bodies (the body reports the error).
pub async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    let mut stream = body.into_data_stream();
    let mut data = Vec::new();
    while let Some(piece) = stream.next().await {
        let piece = piece.map_err(|e| crate::error::body_refusal(e, BODY_BYTES_MAX))?;
        if data.len() + piece.len() > BODY_BYTES_MAX {
            return Err(ApiError::PayloadTooLarge(format!("a WebDAV request body is at most {BODY_BYTES_MAX} bytes")));
        }
        data.extend_from_slice(&piece);
    }
    check_xml(&data)?;
    Ok(Bytes::from(data))
}

/// Refuses an XML body nesting deeper than [`XML_DEPTH_MAX`]. Anything else passes as it is:
/// malformed XML is refused by the library (with the same parser, which stops where this one
/// stopped, so it never goes deeper than what was counted here). No recursion, bounded memory
/// (the parser's own limits on names, attributes and entity expansion).
pub fn check_xml(body: &[u8]) -> Result<(), ApiError> {
    match xml_depth(body, XML_DEPTH_MAX) {
        Some(_) => Ok(()),
        None => Err(ApiError::BadRequest(format!("the XML body nests more than {XML_DEPTH_MAX} elements deep"))),
    }
}

/// The most elements open at once in `body` (up to where the parser stops: its end, or its
/// first error), or `None` once that passes `max`.
pub fn xml_depth(body: &[u8], max: usize) -> Option<usize> {
    // `xmltree::Element::parse` reads with exactly this configuration.
    let mut reader = xmltree::ParserConfig::new().ignore_comments(false).create_reader(body);
    let (mut depth, mut deepest) = (0usize, 0usize);
    loop {
        match reader.next() {
            Ok(XmlEvent::StartElement { .. }) => {
                depth += 1;
                if depth > max {
                    return None;
                }
                deepest = deepest.max(depth);
            }
            Ok(XmlEvent::EndElement { .. }) => depth = depth.saturating_sub(1),
            Ok(XmlEvent::EndDocument) | Err(_) => return Some(deepest),
            Ok(_) => {}
        }
    }
}

/// The path a `Destination` header names under [`PREFIX`], parsed once (the library is
/// handed [`canonical`] of it): an absolute path, or an absolute `http`/`https` URL whose
/// path is taken (its host is not looked at: a proxy may rename it). Refused (400): anything
/// but visible ASCII without spaces, a backslash anywhere (URL parsers disagree on it: the
/// WHATWG one reads `\` as `/` in http URLs), more than [`DESTINATION_BYTES_MAX`] bytes, a
/// fragment, `..` above the root, an encoded `/` or NUL in a segment, a path outside
/// [`PREFIX`].
pub fn destination(value: &HeaderValue) -> Result<DavPath, ApiError> {
    let bad = |why: &str| ApiError::BadRequest(format!("Destination: {why}"));
    let bytes = value.as_bytes();
    if bytes.len() > DESTINATION_BYTES_MAX {
        return Err(bad(&format!("longer than {DESTINATION_BYTES_MAX} bytes")));
    }
    if let Some(odd) = bytes.iter().find(|&&b| !(0x21..=0x7e).contains(&b)) {
        return Err(bad(&format!("byte {odd:#04x} must be percent-encoded")));
    }
    if bytes.contains(&b'\\') {
        return Err(bad("a backslash must be percent-encoded (%5C)"));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| bad("not ASCII"))?;
    let path = if text.starts_with('/') {
        text.to_owned()
    } else {
        let uri: axum::http::Uri = text.parse().map_err(|_| bad("neither an absolute path nor an absolute URL"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
            return Err(bad("an absolute URL is http or https, with a host"));
        }
        uri.path().to_owned()
    };
    let mut parsed = DavPath::new(&path).map_err(|e| bad(&format!("not a path WebDAV takes ({e})")))?;
    let full = parsed.with_prefix().as_bytes();
    if !(full == PREFIX.as_bytes() || full.starts_with(format!("{PREFIX}/").as_bytes())) {
        return Err(bad(&format!("not under {PREFIX}/")));
    }
    parsed.set_prefix(PREFIX).map_err(|_| bad(&format!("not under {PREFIX}/")))?;
    // What the library is handed (encoded, up to three bytes a byte) stays within the bound
    // too, so it reads back as this path (the fuzz target `destination` found one that did not).
    if parsed.with_prefix().as_url_string().len() > DESTINATION_BYTES_MAX {
        return Err(bad(&format!("longer than {DESTINATION_BYTES_MAX} bytes once percent-encoded")));
    }
    Ok(parsed)
}

/// One condition of an `If` list: a state token (a lock token) or an entity tag, maybe negated.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Condition {
    Token { not: bool, token: String },
    ETag { not: bool, weak: bool, opaque: String },
}

/// Reads `<...>`: at least one visible character, none of `<>"\` or whitespace.
fn coded(text: &[u8]) -> Option<(&str, &[u8])> {
    let rest = text.strip_prefix(b"<")?;
    let end = rest.iter().position(|&b| b == b'>')?;
    let inner = &rest[..end];
    let fine = |b: &u8| (0x21..=0x7e).contains(b) && !b"<>\"\\".contains(b);
    if inner.is_empty() || !inner.iter().all(fine) {
        return None;
    }
    Some((std::str::from_utf8(inner).ok()?, &rest[end + 1..]))
}

/// Reads `[W/"..."]` or `["..."]`: an entity tag, its opaque part visible characters but `"`.
fn entity_tag(text: &[u8]) -> Option<(bool, &str, &[u8])> {
    let rest = text.strip_prefix(b"[")?;
    let (weak, rest) = match rest.strip_prefix(b"W/") {
        Some(rest) => (true, rest),
        None => (false, rest),
    };
    let rest = rest.strip_prefix(b"\"")?;
    let end = rest.iter().position(|&b| b == b'"')?;
    let opaque = &rest[..end];
    if !opaque.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return None;
    }
    let rest = rest[end + 1..].strip_prefix(b"]")?;
    Some((weak, std::str::from_utf8(opaque).ok()?, rest))
}

/// An entity tag as this node takes one: `"…"` or `W/"…"`, the opaque part visible ASCII
/// but `"`, `,` and whitespace (what the library splits lists on).
fn strict_etag(text: &str) -> Option<&str> {
    let opaque = text.strip_prefix("W/").unwrap_or(text);
    let inner = opaque.strip_prefix('"')?.strip_suffix('"')?;
    inner.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b'"' && b != b',').then_some(text)
}

/// `If-Match` or `If-None-Match` (`*`, or entity tags separated by commas), or `If-Range`
/// (`if_range`: one entity tag, or an HTTP date, which is left as it is), rebuilt from what
/// was parsed. Refused (400): a malformed entity tag (the library would slice a lone `"`
/// and panic), more than [`IF_LISTS_MAX`] tags.
pub fn etags(value: &HeaderValue, if_range: bool) -> Result<HeaderValue, ApiError> {
    let bad =
        || ApiError::BadRequest("an entity tag is \"…\" or W/\"…\", and a list of them is comma-separated".into());
    let text = value.to_str().map_err(|_| bad())?.trim();
    if if_range {
        if !(text.starts_with('"') || text.starts_with("W/")) {
            return Ok(value.clone());
        }
        return strict_etag(text).and_then(|t| HeaderValue::from_str(t).ok()).ok_or_else(bad);
    }
    if text == "*" {
        return Ok(HeaderValue::from_static("*"));
    }
    let tags: Vec<&str> = text.split(',').map(str::trim).collect();
    if tags.len() > IF_LISTS_MAX {
        return Err(bad());
    }
    let tags = tags.into_iter().map(|t| strict_etag(t).ok_or_else(bad)).collect::<Result<Vec<_>, _>>()?;
    HeaderValue::from_str(&tags.join(", ")).map_err(|_| bad())
}

/// A resource tag of `If` rebuilt from what was parsed: its scheme and host as they are, its
/// path read as [`destination`] reads one (under [`PREFIX`]) and percent-encoded again, so
/// the library's URL parser reads the path this node read.
fn resource_tag(url: &str) -> Option<String> {
    let uri: axum::http::Uri = url.parse().ok()?;
    let scheme = uri.scheme_str().filter(|s| matches!(*s, "http" | "https"))?;
    let authority = uri.authority()?.as_str();
    if authority.contains('@') {
        return None;
    }
    let path = destination(&HeaderValue::from_str(url).ok()?).ok()?;
    Some(format!("{scheme}://{authority}{}", path.with_prefix().as_url_string()))
}

/// The `If` header (RFC 4918 10.4): lists of conditions, each list maybe tagged with the
/// resource it is about; rebuilt from what was parsed (the library reads that, not the
/// client's text). A state token may come bare, as some clients send it (the library takes
/// any word with a `:`); it is handed on between `<>`. Refused (400): anything else, past
/// [`IF_BYTES_MAX`] bytes, [`IF_LISTS_MAX`] lists or [`IF_CONDITIONS_MAX`] conditions in one.
pub fn if_header(value: &HeaderValue) -> Result<HeaderValue, ApiError> {
    let bad = |why: &str| ApiError::BadRequest(format!("If: {why}"));
    let mut text = value.as_bytes();
    if text.len() > IF_BYTES_MAX {
        return Err(bad(&format!("longer than {IF_BYTES_MAX} bytes")));
    }
    let skip = |t: &[u8]| -> usize { t.iter().take_while(|b| **b == b' ' || **b == b'\t').count() };
    let mut lists: Vec<(Option<String>, Vec<Condition>)> = Vec::new();
    loop {
        text = &text[skip(text)..];
        if text.is_empty() {
            break;
        }
        if lists.len() == IF_LISTS_MAX {
            return Err(bad(&format!("more than {IF_LISTS_MAX} lists")));
        }
        let mut tag = None;
        if text.starts_with(b"<") {
            let (url, rest) = coded(text).ok_or_else(|| bad("a resource tag is <an http or https URL>"))?;
            tag = Some(resource_tag(url).ok_or_else(|| bad("a resource tag is <an http or https URL under /dav/>"))?);
            text = &rest[skip(rest)..];
        }
        text = text.strip_prefix(b"(").ok_or_else(|| bad("a list is (conditions)"))?;
        let mut conditions = Vec::new();
        loop {
            text = &text[skip(text)..];
            if let Some(rest) = text.strip_prefix(b")") {
                text = rest;
                break;
            }
            if conditions.len() == IF_CONDITIONS_MAX {
                return Err(bad(&format!("more than {IF_CONDITIONS_MAX} conditions in a list")));
            }
            let not = text.starts_with(b"Not") && text.get(3).is_some_and(|b| b" \t<[".contains(b));
            if not {
                text = &text[3..];
                text = &text[skip(text)..];
            }
            if let Some((weak, opaque, rest)) = entity_tag(text) {
                conditions.push(Condition::ETag { not, weak, opaque: opaque.to_owned() });
                text = rest;
            } else if let Some((token, rest)) = coded(text) {
                conditions.push(Condition::Token { not, token: token.to_owned() });
                text = rest;
            } else {
                // A bare state token: a word with a `:`, up to a space or a bracket.
                let end = text.iter().position(|b| b" \t()<>[]".contains(b)).unwrap_or(text.len());
                let word = &text[..end];
                let fine =
                    word.contains(&b':') && word.iter().all(|b| (0x21..=0x7e).contains(b) && *b != b'"' && *b != b'\\');
                if !fine {
                    return Err(bad("a condition is <a state token> or [an entity tag], maybe after Not"));
                }
                let token = std::str::from_utf8(word).map_err(|_| bad("not ASCII"))?;
                conditions.push(Condition::Token { not, token: token.to_owned() });
                text = &text[end..];
            }
        }
        if conditions.is_empty() {
            return Err(bad("a list holds at least one condition"));
        }
        lists.push((tag, conditions));
    }
    if lists.is_empty() {
        return Err(bad("no list"));
    }
    let mut out = String::new();
    for (tag, conditions) in &lists {
        if !out.is_empty() {
            out.push(' ');
        }
        if let Some(tag) = tag {
            out.push_str(&format!("<{tag}> "));
        }
        let rendered: Vec<String> = conditions
            .iter()
            .map(|condition| match condition {
                Condition::Token { not, token } => format!("{}<{token}>", if *not { "Not " } else { "" }),
                Condition::ETag { not, weak, opaque } => {
                    format!("{}[{}\"{opaque}\"]", if *not { "Not " } else { "" }, if *weak { "W/" } else { "" })
                }
            })
            .collect();
        out.push_str(&format!("({})", rendered.join(" ")));
    }
    HeaderValue::from_str(&out).map_err(|_| ApiError::Internal("a rebuilt If header is not a header value".into()))
}

/// What the request's `Destination` becomes: `path` (with the prefix) percent-encoded, which
/// the library reads back as `path` itself.
pub fn canonical(path: &DavPath) -> Result<HeaderValue, ApiError> {
    HeaderValue::from_str(&path.with_prefix().as_url_string())
        .map_err(|_| ApiError::Internal("an encoded path is not a header value".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(text: &str) -> Result<String, ApiError> {
        destination(&HeaderValue::from_str(text).expect("a header value"))
            .map(|path| String::from_utf8_lossy(path.as_bytes()).into_owned())
    }

    #[test]
    fn destinations_are_read_once_and_strictly() {
        assert_eq!(dest("/dav/a/b.txt").expect("a path"), "/a/b.txt");
        assert_eq!(dest("http://host:8080/dav/a%20b/").expect("a URL"), "/a b/");
        assert_eq!(dest("https://host/dav/x/../Shared").expect("dots resolved"), "/Shared");
        assert_eq!(dest("/dav").expect("the root"), "/");
        // The attack: a backslash, which the WHATWG parser reads as a slash.
        for refused in [
            "http://host/dav/x\\..\\Shared",
            "/dav/x\\..\\Shared",
            "/dav/../etc",
            "/davShared",
            "/other/x",
            "ftp://host/dav/x",
            "//host/dav/x",
            "/dav/a#frag",
            "/dav/a%2Fb",
            "/dav/a%00b",
            "/dav/a b",
        ] {
            assert!(dest(refused).is_err(), "{refused:?} was taken");
        }
        // An encoded backslash is a file name's character, and stays encoded on its way on.
        let odd = destination(&HeaderValue::from_static("/dav/x%5C..%5CShared")).expect("a name");
        assert_eq!(odd.as_bytes(), b"/x\\..\\Shared");
        assert_eq!(canonical(&odd).expect("canonical"), "/dav/x%5C..%5CShared");
    }

    #[test]
    fn a_canonical_destination_reads_back_as_itself() {
        for text in ["/dav/a/b.txt", "http://h/dav/%C3%BC%20x/", "/dav/x%5Cy/.%2e/z", "/dav/~a-b_c.d/"] {
            let path = destination(&HeaderValue::from_str(text).expect("a header value")).expect(text);
            let again = destination(&canonical(&path).expect("canonical")).expect("reads back");
            assert_eq!(again.as_bytes(), path.as_bytes(), "{text}");
            assert_eq!(again.with_prefix().as_bytes(), path.with_prefix().as_bytes(), "{text}");
        }
    }

    fn if_of(text: &str) -> Result<String, ApiError> {
        if_header(&HeaderValue::from_str(text).expect("a header value")).map(|v| v.to_str().expect("ascii").to_owned())
    }

    #[test]
    fn if_headers_are_parsed_and_rebuilt_or_refused() {
        for (given, rebuilt) in [
            ("(<opaquelocktoken:a-b>)", "(<opaquelocktoken:a-b>)"),
            ("  (<urn:uuid:1> [W/\"e1\"])  (Not <DAV:no-lock>)", "(<urn:uuid:1> [W/\"e1\"]) (Not <DAV:no-lock>)"),
            ("<http://h/dav/a> ([\"x\"])", "<http://h/dav/a> ([\"x\"])"),
            ("<http://h:8080/dav/a/../b%20c> (<a:b>)", "<http://h:8080/dav/b%20c> (<a:b>)"),
            ("(opaquelocktoken:bare)", "(<opaquelocktoken:bare>)"),
            ("(Not[\"x\"])", "(Not [\"x\"])"),
        ] {
            assert_eq!(if_of(given).expect(given), rebuilt, "{given}");
            // What is handed on reads back as itself.
            assert_eq!(if_of(rebuilt).expect(rebuilt), rebuilt);
        }
        // What the library's scanner read past its end on (the fuzz target found the first).
        for refused in [
            "(<opaquelocktoken:abc>) ([W/\"et",
            "([W/\"e\"",
            "(<abc",
            "(<a b>)",
            "()",
            "",
            "(Not)",
            "(nocolon)",
            "<relative/path> (<a:b>)",
            "<http://h/elsewhere> (<a:b>)",
            "<http://h/dav/x\\..\\y> (<a:b>)",
            "(<a:b>",
            "((<a:b>))",
        ] {
            assert!(if_of(refused).is_err(), "{refused:?} was taken");
        }
    }

    #[test]
    fn entity_tags_are_parsed_and_rebuilt_or_refused() {
        let of = |text: &str, if_range: bool| {
            etags(&HeaderValue::from_str(text).expect("a value"), if_range)
                .map(|v| v.to_str().expect("ascii").to_owned())
        };
        assert_eq!(of("\"a\",W/\"b\" ,  \"c\"", false).expect("a list"), "\"a\", W/\"b\", \"c\"");
        assert_eq!(of(" * ", false).expect("star"), "*");
        assert_eq!(of("W/\"x\"", true).expect("a tag"), "W/\"x\"");
        assert_eq!(of("Sat, 28 Nov 2026 04:00:00 GMT", true).expect("a date"), "Sat, 28 Nov 2026 04:00:00 GMT");
        // A lone quote: what the library sliced and panicked on (found by scripts/fuzz).
        for refused in ["\"", "W/\"", "\"a\", \"", "\"a\"b\"", "a", "\"a b\"", ""] {
            assert!(of(refused, false).is_err(), "{refused:?} was taken");
        }
        assert!(of("\"", true).is_err());
        assert!(of("W/\"", true).is_err());
    }

    #[test]
    fn deep_xml_is_refused_before_any_tree_is_built() {
        let nested =
            |levels: usize| format!("<?xml version=\"1.0\"?>{}{}", "<a>".repeat(levels), "</a>".repeat(levels));
        assert_eq!(xml_depth(nested(XML_DEPTH_MAX).as_bytes(), XML_DEPTH_MAX), Some(XML_DEPTH_MAX));
        assert!(check_xml(nested(XML_DEPTH_MAX).as_bytes()).is_ok());
        assert!(check_xml(nested(XML_DEPTH_MAX + 1).as_bytes()).is_err());
        // The attack: 21,000 open elements in 63 KB, never closed.
        let attack = format!("<?xml version=\"1.0\"?>{}", "<a>".repeat(21_000));
        assert!(check_xml(attack.as_bytes()).is_err());
        // Malformed or empty bodies pass to the library, which answers them as before.
        assert!(check_xml(b"").is_ok());
        assert!(check_xml(b"<a><b></a>").is_ok());
        let propfind = "<?xml version=\"1.0\"?><D:propfind xmlns:D=\"DAV:\"><D:prop><D:getetag/></D:prop></D:propfind>";
        assert_eq!(xml_depth(propfind.as_bytes(), XML_DEPTH_MAX), Some(3));
    }
}
