//! API errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
//!
//! Every failure a route can produce is an [`ApiError`]; its status is 4xx for anything the
//! client can fix (the message says what to fix) and 5xx only for the server's own faults.

use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// One error response.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status} {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `server_error`, ...
    pub kind: &'static str,
    /// The request field at fault, if any.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// 400 `invalid_request_error`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 400 naming the field at fault.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::bad_request(message).with_param(param)
    }

    /// 400 for a field kestrel understands but cannot honour.
    pub fn unsupported(param: &str, why: &str) -> Self {
        ApiError::invalid_param(
            param,
            format!("`{param}` is not supported by kestrel: {why}"),
        )
        .with_code("unsupported_parameter")
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            ..ApiError::bad_request(message)
        }
    }

    pub fn model_not_found(requested: &str, served: &str) -> Self {
        ApiError::not_found(format!(
            "the model `{requested}` does not exist; this server serves `{served}`"
        ))
        .with_param("model")
        .with_code("model_not_found")
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            code: Some("invalid_api_key"),
            ..ApiError::bad_request(message)
        }
    }

    pub fn payload_too_large(limit: usize) -> Self {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: Some("request_too_large"),
            ..ApiError::bad_request(format!(
                "request body is larger than the {} byte limit",
                limit
            ))
        }
    }

    /// 500: the server's own fault (never a client mistake).
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            ..ApiError::bad_request(message)
        }
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The JSON body, also used for an error inside an SSE stream.
    pub fn body_json(&self) -> String {
        let body = Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        };
        serde_json::to_string(&body).unwrap_or_else(|_| String::from("{\"error\":{}}"))
    }

    /// Maps axum's body-reading rejection (size limit, broken stream) to our shape.
    pub fn from_body_rejection(rejection: BytesRejection, limit: usize) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::payload_too_large(limit)
        } else {
            ApiError {
                status: rejection.status(),
                ..ApiError::bad_request(format!(
                    "could not read the request body: {}",
                    rejection.body_text()
                ))
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = %self.status, message = %self.message, "request failed");
        } else {
            tracing::info!(
                status = %self.status,
                param = self.param.as_deref().unwrap_or(""),
                message = %self.message,
                "request rejected"
            );
        }
        (
            self.status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.body_json(),
        )
            .into_response()
    }
}

/// Parses a JSON body into `T`; the error names the field at fault and what was wrong.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        None => {
            return Err(ApiError::bad_request(
                "the request body is empty; expected a JSON object",
            ))
        }
        Some(b'{') => {}
        Some(_) if serde_json::from_slice::<serde_json::Value>(body).is_ok() => {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ))
        }
        Some(_) => {} // not JSON at all: the parser below says where
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    let result: Result<T, _> = serde_path_to_error::deserialize(de);
    result.map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return ApiError::bad_request(format!("the request body is not valid JSON: {inner}"));
        }
        if path.is_empty() || path == "." {
            ApiError::bad_request(format!("invalid request: {inner}"))
        } else {
            ApiError::invalid_param(path.clone(), format!("invalid `{path}`: {inner}"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct T {
        temperature: Option<f32>,
        messages: Vec<serde_json::Value>,
    }

    #[test]
    fn shape_is_openai() {
        let e = ApiError::invalid_param("n", "only n = 1 is supported");
        let v: serde_json::Value = serde_json::from_str(&e.body_json()).unwrap();
        assert_eq!(v["error"]["message"], "only n = 1 is supported");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "n");
        assert!(v["error"]["code"].is_null());
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn json_errors_name_the_field() {
        let e = parse_json::<T>(br#"{"temperature": "hot", "messages": []}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert!(e.message.contains("invalid type"), "{}", e.message);
        let e = parse_json::<T>(br#"{"messages": [1,"#).unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        assert!(e.param.is_none());
        let e = parse_json::<T>(br#"{}"#).unwrap_err();
        assert!(
            e.message.contains("missing field `messages`"),
            "{}",
            e.message
        );
        let e = parse_json::<T>(b"  ").unwrap_err();
        assert!(e.message.contains("empty"), "{}", e.message);
        let e = parse_json::<T>(b"[1,2]").unwrap_err();
        assert!(e.message.contains("must be a JSON object"), "{}", e.message);
        let e = parse_json::<T>(b"nope").unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
    }
}
