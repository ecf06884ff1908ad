//! Link flags of a Node addon (napi symbols resolved at load time).
fn main() {
    napi_build::setup();
}
