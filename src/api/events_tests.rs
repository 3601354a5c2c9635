use super::*;

fn headers(id: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("last-event-id", HeaderValue::from_str(id).unwrap());
    headers
}

#[test]
fn a_limit_events_id_resumes_after_its_seq_and_a_progress_id_from_the_first() {
    let done = Cursor {
        slots: 2,
        since_slot: 1,
        state: 4,
        done: true,
    };
    let id = done.encode();
    let (cursor, seq) = resume_from(&headers(&format!("{id}.7"))).unwrap();
    assert_eq!((cursor.encode(), cursor.done, seq), (id, true, 7));
    let (cursor, seq) = resume_from(&headers(&id.to_string())).unwrap();
    assert_eq!((cursor.encode(), seq), (id, 0));
    assert_eq!(resume_from(&HeaderMap::new()).unwrap().1, 0);
    for bad in [
        format!("{id}."),
        format!("{id}.x"),
        ".3".into(),
        format!("{id}.1.2"),
    ] {
        let err = resume_from(&headers(&bad)).unwrap_err();
        assert_eq!(err.details.field.as_deref(), Some("Last-Event-ID"), "{bad}");
    }
}
