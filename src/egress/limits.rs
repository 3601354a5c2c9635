//! The proxy's limits as values that live exactly as long as what they count.

use std::sync::Arc;

use crate::identity::TunnelSlot;
use crate::telemetry::ActiveGauge;

/// One client connection's share of the proxy's limits (its `max_connections` permit and
/// its place in the gauge). Held, through [`Hold`], by everything the connection starts, so
/// a CONNECT tunnel and a WebSocket count against the limit until they close.
pub(crate) struct ConnectionSlot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    _active: ActiveGauge,
}

impl ConnectionSlot {
    pub fn new(permit: tokio::sync::OwnedSemaphorePermit) -> Arc<ConnectionSlot> {
        Arc::new(ConnectionSlot {
            _permit: permit,
            _active: ActiveGauge::new("sandgate_proxy_connections_active"),
        })
    }
}

/// What a request, tunnel or upgraded stream keeps hold of while it lives: its client
/// connection's slot and, inside a CONNECT tunnel, the identity's tunnel slot.
#[derive(Clone)]
pub(crate) struct Hold {
    _connection: Arc<ConnectionSlot>,
    _tunnel: Option<Arc<TunnelSlot>>,
}

impl Hold {
    pub fn connection(connection: Arc<ConnectionSlot>) -> Hold {
        Hold {
            _connection: connection,
            _tunnel: None,
        }
    }

    /// The same hold, plus a tunnel slot.
    pub fn with_tunnel(&self, tunnel: TunnelSlot) -> Hold {
        Hold {
            _connection: self._connection.clone(),
            _tunnel: Some(Arc::new(tunnel)),
        }
    }
}
