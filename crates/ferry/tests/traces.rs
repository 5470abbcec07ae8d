//! One `tracing` span per operation, with the fields and events that
//! docs/metrics.md promises, and never the token.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};

use ferry::{Connector, Descriptor, TransportKind};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

#[derive(Default, Debug)]
struct Captured {
    name: String,
    fields: BTreeMap<String, String>,
    events: Vec<String>,
    closed: bool,
}

#[derive(Default, Clone)]
struct Capture {
    spans: Arc<Mutex<BTreeMap<u64, Captured>>>,
    /// Everything any span or event said, as text.
    text: Arc<Mutex<String>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>, &'a mut String);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let v = format!("{value:?}").trim_matches('"').to_string();
        let _ = writeln!(self.1, "{}={v}", field.name());
        self.0.insert(field.name().to_string(), v);
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut c = Captured {
            name: attrs.metadata().name().to_string(),
            ..Captured::default()
        };
        attrs.record(&mut Fields(
            &mut c.fields,
            &mut self.text.lock().unwrap_or_else(|e| e.into_inner()),
        ));
        self.spans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.into_u64(), c);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(c) = self
            .spans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&id.into_u64())
        {
            values.record(&mut Fields(
                &mut c.fields,
                &mut self.text.lock().unwrap_or_else(|e| e.into_inner()),
            ));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(
            &mut fields,
            &mut self.text.lock().unwrap_or_else(|e| e.into_inner()),
        ));
        if let Some(span) = ctx.event_span(event) {
            if let Some(c) = self
                .spans
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(&span.id().into_u64())
            {
                c.events.push(fields.remove("message").unwrap_or_default());
            }
        }
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        if let Some(c) = self
            .spans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&id.into_u64())
        {
            c.closed = true;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_span_per_operation_without_the_token() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone().with_filter(
        tracing_subscriber::filter::Targets::new().with_target("ferry::op", tracing::Level::INFO),
    ));
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let c = || {
        Connector::builder()
            .listen("127.0.0.1:0".parse().unwrap())
            .transports(&[TransportKind::Tcp])
    };
    let a = c().worker_id("trace-a").build().await.unwrap();
    let b = c().worker_id("trace-b").build().await.unwrap();
    let readable = a
        .create_readable(vec![
            Descriptor::from_vec(vec![5u8; 3000]),
            vec![6u8; 96].into(),
        ])
        .await
        .unwrap();
    let json = readable.metadata().to_json();
    let token: serde_json::Value = serde_json::from_str(&json).unwrap();
    let token = token["token"]
        .as_str()
        .expect("a token in the metadata")
        .to_string();
    assert_eq!(token.len(), 32);
    let read = b
        .begin_read(
            readable.metadata(),
            vec![vec![0u8; 3000].into(), vec![0u8; 96].into()],
        )
        .await
        .unwrap();
    read.wait_for_completion().await.unwrap();
    readable.wait_for_completion().await.unwrap();
    let cancelled = a.create_writable(vec![vec![0u8; 10].into()]).await.unwrap();
    let wtoken = serde_json::from_str::<serde_json::Value>(&cancelled.metadata().to_json())
        .unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    cancelled.cancel();

    // A waiter wakes as the operation ends; its span closes right after.
    for _ in 0..500 {
        let closed = capture
            .spans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|c| c.closed)
            .count();
        if closed == 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let spans = capture.spans.lock().unwrap_or_else(|e| e.into_inner());
    let ops: Vec<&Captured> = spans.values().filter(|c| c.name == "ferry.op").collect();
    assert_eq!(ops.len(), 3, "one span per operation: {ops:#?}");
    let by_kind = |k: &str| *ops.iter().find(|c| c.fields["kind"] == k).unwrap();
    let (r, rd, w) = (by_kind("read"), by_kind("readable"), by_kind("writable"));
    for (span, side, peer) in [(r, "active", "trace-a"), (rd, "passive", "trace-b")] {
        assert_eq!(span.fields["side"], side);
        assert_eq!(span.fields["bytes"], "3096");
        assert_eq!(span.fields["descriptors"], "2");
        assert_eq!(span.fields["peer"], peer);
        assert_eq!(span.fields["transport"], "tcp");
        assert_eq!(span.fields["outcome"], "complete");
        assert!(span.closed, "the span ends with the operation");
        for e in ["created", "open", "sealed", "end"] {
            assert!(
                span.events.iter().any(|x| x == e),
                "{e} in {:?}",
                span.events
            );
        }
        assert_eq!(span.events.first().map(String::as_str), Some("created"));
        assert_eq!(span.events.last().map(String::as_str), Some("end"));
    }
    // The source saw its first byte leave, the destination its first arrive.
    for span in [r, rd] {
        assert!(
            span.events.iter().any(|x| x == "first byte"),
            "{:?}",
            span.events
        );
    }
    assert_eq!(w.fields["outcome"], "cancelled");
    assert_eq!(w.fields["transport"], "none");
    assert!(!w.fields.contains_key("peer"));
    assert!(w.closed);

    let text = capture.text.lock().unwrap_or_else(|e| e.into_inner());
    assert!(text.contains("kind=read"), "the capture works");
    for t in [&token, &wtoken] {
        assert!(!text.contains(t.as_str()), "a token leaked into a trace");
        assert!(
            !text.contains(&t.to_uppercase()),
            "a token leaked into a trace"
        );
    }
    assert!(!text.contains(&json), "the metadata leaked into a trace");
}
