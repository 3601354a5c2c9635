use proptest::prelude::*;
use regorus::Value;

use super::{write_input, Declined, SharedObject};
use crate::decision_log::LoggedInput;

const PLACEHOLDER: &str = "sgph_0123456789abcdef0123456789abcdef01234567";

fn rendered(input: &Value, full_argv: bool) -> Result<serde_json::Value, Declined> {
    let mut out = Vec::new();
    write_input(input, full_argv, &mut out, &[])?;
    Ok(serde_json::from_slice(&out).expect("the writer writes JSON"))
}

fn general(input: &Value, full_argv: bool) -> serde_json::Value {
    LoggedInput {
        value: input.clone(),
        full_argv,
    }
    .to_json()
}

fn object(fields: Vec<(&str, Value)>) -> Value {
    let mut value = Value::new_object();
    let map = value.as_object_mut().unwrap();
    for (k, v) in fields {
        map.insert(Value::from(k), v);
    }
    value
}

#[test]
fn an_egress_input_is_written_as_the_general_path_writes_it() {
    let input = object(vec![
        ("phase", Value::from("request")),
        (
            "request",
            object(vec![
                ("method", Value::from("GET")),
                (
                    "path",
                    Value::from(format!("/v1/{PLACEHOLDER}?token=abc&x=1")),
                ),
                (
                    "headers",
                    object(vec![
                        ("Authorization", Value::from("Bearer secret-value")),
                        (
                            "x-trace",
                            Value::from(format!("id %73gph_{}", &PLACEHOLDER[5..])),
                        ),
                        ("cookie", Value::Null),
                    ]),
                ),
            ]),
        ),
        (
            "destination",
            object(vec![
                ("host", Value::from("api.example.com")),
                ("port", Value::from(443u64)),
                (
                    "ips",
                    Value::from(vec![Value::from("10.0.0.1"), Value::from(1.5f64)]),
                ),
            ]),
        ),
        ("undefined", Value::Undefined),
    ]);
    let fast = rendered(&input, false).unwrap();
    assert_eq!(fast, general(&input, false));
    let text = fast.to_string();
    assert!(
        !text.contains("secret-value") && !text.contains("abc"),
        "{text}"
    );
    assert!(!text.contains(&PLACEHOLDER[5..]), "{text}");
    assert_eq!(
        fast["request"]["headers"]["cookie"],
        serde_json::Value::Null
    );
    assert_eq!(fast["request"]["path"], "/v1/sgph_[redacted]?token=&x=");
}

#[test]
fn structure_changing_redactions_are_declined() {
    let renamed = object(vec![(PLACEHOLDER, Value::from(1u64))]);
    assert_eq!(rendered(&renamed, false), Err(Declined));
    let exec = object(vec![(
        "exec",
        object(vec![("argv", Value::from(vec![Value::from("ls")]))]),
    )]);
    assert_eq!(rendered(&exec, false), Err(Declined));
    assert_eq!(rendered(&exec, true).unwrap(), general(&exec, true));
    let mut numbered = Value::new_object();
    numbered
        .as_object_mut()
        .unwrap()
        .insert(Value::from(7u64), Value::Null);
    assert_eq!(rendered(&numbered, false), Err(Declined));
}

#[test]
fn write_json_falls_back_to_the_general_path_in_full() {
    let input = object(vec![
        ("a", Value::from("b")),
        (PLACEHOLDER, Value::from("x")),
    ]);
    let logged = LoggedInput {
        value: input.clone(),
        full_argv: false,
    };
    let mut out = b"prefix".to_vec();
    logged.write_json(&mut out);
    let written: serde_json::Value = serde_json::from_slice(&out[6..]).unwrap();
    assert_eq!(written, general(&input, false));
}

const KEYS: &[&str] = &[
    "path",
    "Path",
    "authorization",
    "Cookie",
    "TOKEN",
    "secret",
    "password",
    "x-api-key",
    "host",
    "method",
    "a",
    "b_c",
    "query",
    "exec",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        Just(Value::Undefined),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        "[a-z/_%?=&\"\\\\ é]{0,12}".prop_map(|s| Value::from(s.as_str())),
        "[a-z/?=&]{0,6}".prop_map(|s| Value::from(format!("{s}{PLACEHOLDER}?k=v").as_str())),
        Just(Value::from(
            format!("%2573gph_{}", &PLACEHOLDER[5..]).as_str()
        )),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6)
                .prop_map(|fields| object(fields.into_iter().collect())),
        ]
    })
}

proptest! {
    /// Whatever the input, the one-pass writer either declines or writes the document the
    /// general path writes: same redactions, same values.
    #[test]
    fn the_writer_agrees_with_the_general_path(input in value(), full_argv in any::<bool>()) {
        if let Ok(fast) = rendered(&input, full_argv) {
            prop_assert_eq!(fast, general(&input, full_argv));
        }
    }
}

proptest! {
    /// A string is written byte for byte as serde_json writes it, whether it takes the
    /// copy-whole path or needs escaping (quotes, backslashes, control characters, DEL and
    /// non-ASCII, which JSON leaves as they are).
    #[test]
    fn strings_are_written_exactly_as_serde_json_writes_them(
        s in "[a-z\"\\\\\u{0}-\u{1f}\u{7f}é€😀 ]{0,24}"
    ) {
        let mut ours = Vec::new();
        super::write_str(&s, &mut ours);
        prop_assert_eq!(ours, serde_json::to_vec(&s).unwrap());
    }
}

/// Objects built once and shared by several inputs (as a tunnel's sandbox and destination
/// are shared by its requests), under any keys, secret ones included; and the inputs.
fn shared_inputs() -> impl Strategy<Value = (Vec<Value>, Vec<Value>)> {
    let parts = prop::collection::vec(
        prop::collection::vec((prop::sample::select(KEYS), value()), 0..4)
            .prop_map(|fields| object(fields.into_iter().collect())),
        1..4,
    );
    parts.prop_flat_map(|parts| {
        let n = parts.len();
        let input = prop::collection::vec((prop::sample::select(KEYS), 0..n), 0..4);
        prop::collection::vec(input, 1..8).prop_map(move |inputs| {
            let inputs = inputs
                .into_iter()
                .map(|fields| {
                    object(
                        fields
                            .into_iter()
                            .map(|(key, i)| (key, parts[i].clone()))
                            .collect(),
                    )
                })
                .collect();
            (parts.clone(), inputs)
        })
    })
}

proptest! {
    /// With its top-level objects shared, every input is written byte for byte as without
    /// (or declined as without), the first time each object is rendered and every time after.
    #[test]
    fn shared_objects_write_what_the_writer_writes((parts, inputs) in shared_inputs()) {
        let shared: Vec<_> = parts.iter().map(|p| Some(SharedObject::new(p.clone()))).collect();
        for input in inputs.iter().chain(&inputs) {
            let mut plain = Vec::new();
            let plain = write_input(input, false, &mut plain, &[]).map(|()| plain);
            let mut reused = Vec::new();
            let reused = write_input(input, false, &mut reused, &shared).map(|()| reused);
            prop_assert_eq!(plain, reused);
        }
    }
}

#[test]
fn a_shared_object_is_rendered_once_and_serves_only_itself() {
    let destination = object(vec![("host", Value::from("api.example.com"))]);
    let shared = [Some(SharedObject::new(destination.clone())), None];
    let rendered =
        |s: &[Option<std::sync::Arc<SharedObject>>]| s[0].as_ref().unwrap().json.get().is_some();
    // An equal object built apart is not this one: written on its own, nothing rendered.
    let twin = object(vec![("host", Value::from("api.example.com"))]);
    let mut apart = Vec::new();
    write_input(
        &object(vec![("destination", twin)]),
        false,
        &mut apart,
        &shared,
    )
    .unwrap();
    assert!(!rendered(&shared), "identity, not equality");
    // Under a key whose value is redacted whole, it is redacted, not rendered.
    let mut secret = Vec::new();
    let input = object(vec![("authorization", destination.clone())]);
    write_input(&input, false, &mut secret, &shared).unwrap();
    assert!(String::from_utf8_lossy(&secret).contains("[redacted]"));
    assert!(!rendered(&shared));
    // Under any other key, rendered once and then written from its rendering.
    let input = object(vec![("destination", destination)]);
    let mut first = Vec::new();
    write_input(&input, false, &mut first, &shared).unwrap();
    assert!(rendered(&shared));
    assert_eq!(first, apart, "the same document as the object built apart");
    let mut again = Vec::new();
    write_input(&input, false, &mut again, &shared).unwrap();
    assert_eq!(again, first);
}
