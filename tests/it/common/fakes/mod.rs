//! Fakes of the sandbox providers' APIs, on real sockets, for the provider adapters' tests.
//! Each is proven against the provider's official SDK (see each module's documentation).

pub mod blaxel;
pub mod cloudflare;
pub mod codesandbox;
pub mod daytona;
pub mod e2b;
pub mod freestyle;
pub mod modal;
pub mod northflank;
pub mod prime;
pub mod runloop;
pub mod vercel;
