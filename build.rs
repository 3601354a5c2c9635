//! `sqlx::migrate!` embeds the migration files at compile time, but only the files that
//! existed when it ran are tracked: without this, a new migration in `migrations/` or
//! `migrations/postgres/` would not be in the binary until something else changed.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
