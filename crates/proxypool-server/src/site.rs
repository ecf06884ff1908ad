//! The site of a target host: its registrable domain (public suffix + one label), so that
//! `www.shop.example` and `img.shop.example` share one reputation column in the pool.

use std::net::IpAddr;

/// `www.shop.co.uk` → `shop.co.uk`; IP literals and hosts without a registrable domain
/// (`localhost`) are their own site.
pub(crate) fn site_of(host: &str) -> String {
    let host = host.trim_end_matches('.');
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<IpAddr>().is_ok() {
        return bare.to_owned();
    }
    let lower = host.to_ascii_lowercase();
    match psl::domain_str(&lower) {
        Some(domain) => domain.to_owned(),
        None => lower,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrable_domains() {
        assert_eq!(site_of("www.shop.co.uk"), "shop.co.uk");
        assert_eq!(site_of("IMG.Example.COM."), "example.com");
        assert_eq!(site_of("example.com"), "example.com");
        assert_eq!(site_of("127.0.20.1"), "127.0.20.1");
        assert_eq!(site_of("[::1]"), "::1");
        assert_eq!(site_of("localhost"), "localhost");
    }
}
