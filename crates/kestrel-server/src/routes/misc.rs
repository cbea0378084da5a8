//! Small routes: models, health, tokenize / detokenize, metrics.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{body_bytes, check_ids};
use crate::errors::{parse_json, ApiError};
use crate::openai_types::{
    DetokenizeRequest, DetokenizeResponse, ModelCard, ModelList, TokenizeRequest, TokenizeResponse,
};
use crate::AppState;

fn card(state: &AppState) -> ModelCard {
    ModelCard {
        id: state.config().model_name.clone(),
        object: "model",
        created: state.shared().created,
        owned_by: "kestrel",
    }
}

pub(super) async fn models(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![card(&state)],
    })
}

pub(super) async fn model(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    if id != state.config().model_name {
        return Err(ApiError::model_not_found(&id, &state.config().model_name));
    }
    Ok(Json(card(&state)))
}

pub(super) async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

pub(super) async fn tokenize(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let req: TokenizeRequest = parse_json(&body_bytes(&state, body)?)?;
    let tok = state.shared().tokenizer.clone();
    let tokens = super::blocking(move || {
        tok.encode(&req.content, req.add_special, req.parse_special)
            .map_err(|e| ApiError::invalid_param("content", format!("tokenizing failed: {e}")))
    })
    .await?;
    Ok(Json(TokenizeResponse { tokens }))
}

pub(super) async fn detokenize(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let req: DetokenizeRequest = parse_json(&body_bytes(&state, body)?)?;
    let tok = &state.shared().tokenizer;
    check_ids(tok, &req.tokens, "tokens")?;
    Ok(Json(DetokenizeResponse {
        content: tok.decode(&req.tokens, false),
    }))
}

pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    let shared = state.shared();
    let text = shared.metrics.render(&shared.backend.stats());
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response()
}
