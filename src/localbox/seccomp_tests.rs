use super::*;

#[test]
fn the_list_names_each_call_once_with_its_number_here() {
    let mut seen = std::collections::BTreeMap::new();
    for (group, call) in calls() {
        assert!(!group.why.is_empty() && call.nr >= 0, "{}", call.name);
        if let Some(other) = seen.insert(call.nr, call.name) {
            panic!("{} and {other} share number {}", call.name, call.nr);
        }
    }
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        assert_eq!(seen.get(&libc::SYS_setns), Some(&"setns"));
        assert_eq!(
            calls()
                .find(|(_, c)| c.name == "clone3")
                .map(|(_, c)| c.refusal),
            Some(Refusal::Unavailable)
        );
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    assert!(seen.is_empty() && Filter::new().is_err());
}

#[test]
fn the_filter_compiles_where_there_is_a_list() {
    if REFUSED.is_empty() {
        return;
    }
    let filter = Filter::new().expect("compiles");
    // The x32 guard on x86_64, then ENOSYS and EPERM.
    let expected = if cfg!(target_arch = "x86_64") { 3 } else { 2 };
    assert_eq!(filter.programs.len(), expected);
    assert!(filter.programs.iter().all(|p| p.len() < 4096));
}
