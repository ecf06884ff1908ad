//! `GET /api/v1/links/{code}/qr`: a QR code of a link's short URL, as SVG or PNG. The short
//! URL of a code never changes, so the image is cacheable for long.

use super::auth::required_principal;
use super::error::{ApiError, ErrorBody};
use super::links::visible_link;
use super::{App, AppState};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use qrcode::render::svg;
use qrcode::{Color, QrCode};
use serde::Deserialize;
use shortener_core::link::Link;
use std::ops::RangeInclusive;
use utoipa::IntoParams;

/// Accepted `size`: the image is at least this many pixels wide and high.
const SIZES: RangeInclusive<u32> = 64..=1024;
/// Pixels unless `size` says otherwise.
const DEFAULT_SIZE: u32 = 256;
/// Light modules around the code, as the QR standard asks.
const QUIET_ZONE: usize = 4;
/// Private: the link's owner or an admin fetched it with a token.
const CACHE_CONTROL: &str = "private, max-age=86400";

/// The query string of the QR code; unknown parameters are refused.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct QrParams {
    /// `svg` (default) or `png`.
    #[param(value_type = Option<String>, pattern = "^(svg|png)$")]
    format: Option<String>,
    /// At least this many pixels wide and high, 64 to 1024 (default 256).
    #[param(value_type = Option<u32>, minimum = 64, maximum = 1024)]
    size: Option<String>,
}

/// An image format of the QR code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Svg,
    Png,
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_query", message)
}

impl QrParams {
    fn parse(self) -> Result<(Format, u32), ApiError> {
        let format = match self.format.as_deref() {
            None | Some("svg") => Format::Svg,
            Some("png") => Format::Png,
            Some(_) => return Err(invalid("format must be svg or png")),
        };
        let size = match self.size.as_deref().map(str::parse::<u32>) {
            None => DEFAULT_SIZE,
            Some(Ok(n)) if SIZES.contains(&n) => n,
            Some(_) => {
                return Err(invalid(format!(
                    "size must be between {} and {}",
                    SIZES.start(),
                    SIZES.end()
                )));
            }
        };
        Ok((format, size))
    }
}

/// 500 for an encoder's failure (a short URL too long for a QR code, say), logged.
fn internal(encoder: &str, error: &dyn std::fmt::Display) -> ApiError {
    tracing::error!(%error, "{encoder} encoding failed");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "internal error",
    )
}

/// A PNG of `code`, greyscale, at least `size` pixels wide: whole pixels per module, so
/// that every module stays sharp.
fn png(code: &QrCode, size: u32) -> Result<Vec<u8>, png::EncodingError> {
    let modules = code.width() + 2 * QUIET_ZONE;
    let scale = (size as usize).div_ceil(modules);
    let side = modules * scale;
    let colors = code.to_colors();
    let mut pixels = vec![255u8; side * side];
    for (i, color) in colors.iter().enumerate() {
        if *color != Color::Dark {
            continue;
        }
        let (mx, my) = (i % code.width() + QUIET_ZONE, i / code.width() + QUIET_ZONE);
        for y in my * scale..(my + 1) * scale {
            pixels[y * side + mx * scale..y * side + (mx + 1) * scale].fill(0);
        }
    }
    let mut out = Vec::new();
    let side = u32::try_from(side).unwrap_or(u32::MAX);
    let mut encoder = png::Encoder::new(&mut out, side, side);
    encoder.set_color(png::ColorType::Grayscale);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(&pixels)?;
    writer.finish()?;
    Ok(out)
}

/// A QR code of the link's short URL (its owner or an admin).
#[utoipa::path(
    get, path = "/api/v1/links/{code}/qr", tag = "links", operation_id = "link_qr",
    params(("code" = String, Path, description = "Short code or alias"), QrParams),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The QR code (`Cache-Control: private, max-age=86400`)",
         content((String = "image/svg+xml"), (String = "image/png"))),
        (status = 400, description = "Unknown parameter, a format other than svg/png, size outside 64-1024 (`invalid_query`)", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 404, description = "Unknown, or not visible to this token", body = ErrorBody),
        (status = 503, description = "Store unavailable", body = ErrorBody),
    )
)]
pub(super) async fn image(
    State(app): State<AppState>,
    Path(code): Path<String>,
    headers: HeaderMap,
    params: Result<Query<QrParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let who = required_principal(&app, &headers).await?;
    let Query(params) = params.map_err(|e| invalid(e.body_text()))?;
    let (format, size) = params.parse()?;
    let link = visible_link(&app, &code, &who).await?;
    render(&app, &link, format, size)
}

/// The web app's QR code of a link: an SVG.
pub(super) fn svg(app: &App, link: &Link) -> Result<Response, ApiError> {
    render(app, link, Format::Svg, 192)
}

/// The QR code of `link`'s short URL as a cacheable response.
fn render(app: &App, link: &Link, format: Format, size: u32) -> Result<Response, ApiError> {
    let short_url = format!("{}/{}", app.base_url, link.code);
    let qr = QrCode::new(short_url.as_bytes()).map_err(|e| internal("QR", &e))?;
    let (content_type, body) = match format {
        Format::Svg => (
            "image/svg+xml",
            qr.render::<svg::Color<'_>>()
                .min_dimensions(size, size)
                .build()
                .into_bytes(),
        ),
        Format::Png => (
            "image/png",
            png(&qr, size).map_err(|e| internal("PNG", &e))?,
        ),
    };
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(CACHE_CONTROL),
    );
    Ok(response)
}
