//! A cookie-keeping visitor of the web app for plain HTTP tests: it reads `Set-Cookie`
//! itself (so tests can look at the flags) and the CSRF token of the last page.

use super::{BROWSER, Shortener};
use reqwest::header::{COOKIE, SET_COOKIE};
use reqwest::{Response, StatusCode};
use std::collections::BTreeMap;

pub struct WebVisitor {
    http: reqwest::Client,
    pub base: String,
    /// Cookie name → value.
    pub cookies: BTreeMap<String, String>,
    /// Raw `Set-Cookie` values of the last response.
    pub last_set_cookies: Vec<String>,
    /// The `csrf` field of the last page that had a form.
    pub csrf: Option<String>,
}

/// The value of the first `name="csrf" value="…"` in `html`.
pub fn csrf_of(html: &str) -> Option<String> {
    let at = html.find(r#"name="csrf" value=""#)? + r#"name="csrf" value=""#.len();
    html[at..].split('"').next().map(str::to_owned)
}

impl WebVisitor {
    pub fn new(server: &Shortener) -> Self {
        Self {
            http: reqwest::Client::builder()
                .user_agent(BROWSER)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            base: server.base.clone(),
            cookies: BTreeMap::new(),
            last_set_cookies: Vec::new(),
            csrf: None,
        }
    }

    fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn keep(&mut self, response: &Response) {
        self.last_set_cookies = response
            .headers()
            .get_all(SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect();
        for set in &self.last_set_cookies {
            let pair = set.split(';').next().unwrap();
            let (name, value) = pair.split_once('=').unwrap();
            if value.is_empty() || set.contains("Max-Age=0") {
                self.cookies.remove(name);
            } else {
                self.cookies.insert(name.to_owned(), value.to_owned());
            }
        }
    }

    /// `GET path`: status and body; remembers cookies and the page's CSRF token.
    pub async fn get(&mut self, path: &str) -> (StatusCode, String) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .header(COOKIE, self.cookie_header())
            .send()
            .await
            .unwrap();
        self.keep(&response);
        let status = response.status();
        let body = response.text().await.unwrap();
        if let Some(csrf) = csrf_of(&body) {
            self.csrf = Some(csrf);
        }
        (status, body)
    }

    /// `POST path` with form `fields` (the CSRF token added unless `fields` has one);
    /// status, `Location` and body.
    pub async fn post(
        &mut self,
        path: &str,
        fields: &[(&str, &str)],
    ) -> (StatusCode, Option<String>, String) {
        let mut form: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        if !fields.iter().any(|(k, _)| *k == "csrf")
            && let Some(csrf) = &self.csrf
        {
            form.push(("csrf".into(), csrf.clone()));
        }
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .header(COOKIE, self.cookie_header())
            .form(&form)
            .send()
            .await
            .unwrap();
        self.keep(&response);
        let status = response.status();
        let location = response
            .headers()
            .get("location")
            .map(|v| v.to_str().unwrap().to_owned());
        let body = response.text().await.unwrap();
        if let Some(csrf) = csrf_of(&body) {
            self.csrf = Some(csrf);
        }
        (status, location, body)
    }

    /// Signs in with `token` through the form; asserts it worked.
    pub async fn sign_in(&mut self, token: &str) {
        self.get("/_/signin").await;
        let (status, location, body) = self.post("/_/signin", &[("token", token)]).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
        assert_eq!(location.as_deref(), Some("/_/links"));
        assert!(self.cookies.contains_key("shortener_session"));
    }
}
