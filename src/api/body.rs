//! JSON request bodies whose errors never echo what was sent: a body may carry a secret,
//! and serde's messages quote offending values. Errors name the field path and the kind of
//! problem only.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ErrorReply;

pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ErrorReply;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|_| {
            ErrorReply::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "the request body could not be read",
            )
        })?;
        let de = &mut serde_json::Deserializer::from_slice(&bytes);
        serde_path_to_error::deserialize(de)
            .map(JsonBody)
            .map_err(|e| {
                let path = e.path().to_string();
                let what = match e.inner().classify() {
                    serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                        "is not valid JSON"
                    }
                    serde_json::error::Category::Io => "could not be read",
                    serde_json::error::Category::Data => "has a missing, unknown or mistyped field",
                };
                let message = if path == "." {
                    format!("the request body {what}")
                } else {
                    format!("the request body {what} at `{path}`")
                };
                ErrorReply::new(StatusCode::BAD_REQUEST, "invalid_request", message)
                    .with_details(serde_json::json!({"field": path}))
            })
    }
}
