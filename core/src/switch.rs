//! On/off switches that processes read from environment variables (`FLOTILLA_PROFILE_UPDATE`,
//! `FLOTILLA_PROGRESS`): one reading of a value, so that every switch refuses the same bad input the same way.

/// The value of the switch `name` (what the environment holds, `None` where unset): `1` on, `0` off, unset or
/// empty `unset`. Anything else is an error naming the variable, its value and what `1` does (`on`).
pub fn parse_switch(name: &str, value: Option<&str>, unset: bool, on: &str) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("") => Ok(unset),
        Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(other) => Err(format!("{name}={other:?}: expected 1 ({on}) or 0")),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_switch;

    #[test]
    fn a_switch_is_1_or_0_its_default_when_unset_and_anything_else_is_refused_by_name() {
        for unset in [false, true] {
            assert_eq!(parse_switch("X", None, unset, "on"), Ok(unset));
            assert_eq!(parse_switch("X", Some(" "), unset, "on"), Ok(unset));
            assert_eq!(parse_switch("X", Some(" 1 "), unset, "on"), Ok(true));
            assert_eq!(parse_switch("X", Some("0"), unset, "on"), Ok(false));
        }
        assert_eq!(parse_switch("X", Some("yes"), false, "do it"), Err("X=\"yes\": expected 1 (do it) or 0".into()));
    }
}
