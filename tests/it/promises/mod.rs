//! The request path's guarantees through a real llmlb on loopback: hard
//! per-replica limits, exactly one outcome per request, no secrets upstream,
//! retries only when nothing was sent, broken streams counted, token
//! accounting from `usage`.

mod bodies;
mod broken;
mod bypass;
mod limits;
mod outcomes;
mod privileges;
mod raw;
mod retries;
mod secrets;
mod stress;
mod tokens;
