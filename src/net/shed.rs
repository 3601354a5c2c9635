//! Turning a connection away when a limit is reached: a 503 `overloaded` in the error shape
//! with `Retry-After`, written without waiting long, then the connection is closed.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::error::{Error, Kind, Retry};

/// Answers 503 `overloaded` with `message` and closes; gives up after two seconds.
pub async fn overloaded(mut stream: TcpStream, message: &'static str) {
    let error = Error::new(
        Kind::Unavailable,
        "overloaded",
        format!("{message}; retry shortly"),
    )
    .retry(Retry::After(Duration::from_secs(1)));
    let body =
        serde_json::to_vec(&serde_json::json!({"error": error.record()})).unwrap_or_default();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nx-sandgate-error: overloaded\r\nretry-after: 1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&body).await?;
        stream.shutdown().await
    })
    .await;
}
