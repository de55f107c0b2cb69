//! The translator's tests: every stream it writes is one the official clients accept.
use super::*;

fn types(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(Event::type_name).collect()
}

fn run(events: Vec<AgentEvent>, ending: Ending) -> Vec<Event> {
    let mut t = Translator::new("t", "r");
    let mut out = Vec::new();
    for e in events {
        t.translate(e, &mut out);
    }
    t.finish(ending, &mut out);
    out
}

#[test]
fn unclosed_things_are_closed_before_the_terminal_event() {
    let out = run(
        vec![
            AgentEvent::StepStarted { name: "s".into() },
            AgentEvent::ReasoningDelta {
                message_id: "r1".into(),
                delta: "hm".into(),
            },
            AgentEvent::TextDelta {
                message_id: "m1".into(),
                delta: "hi".into(),
            },
            AgentEvent::ToolCallStart {
                tool_call_id: "c1".into(),
                name: "f".into(),
                parent_message_id: None,
            },
        ],
        Ending::Cancelled,
    );
    assert_eq!(
        types(&out),
        [
            "RUN_STARTED",
            "STEP_STARTED",
            "REASONING_START",
            "REASONING_MESSAGE_START",
            "REASONING_MESSAGE_CONTENT",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TOOL_CALL_START",
            "TOOL_CALL_END",
            "TEXT_MESSAGE_END",
            "REASONING_MESSAGE_END",
            "REASONING_END",
            "STEP_FINISHED",
            "RUN_FINISHED",
        ]
    );
}

#[test]
fn bare_ends_results_and_empty_deltas_are_dropped() {
    let out = run(
        vec![
            AgentEvent::TextEnd {
                message_id: "x".into(),
            },
            AgentEvent::ToolCallEnd {
                tool_call_id: "x".into(),
            },
            AgentEvent::ToolCallArgs {
                tool_call_id: "x".into(),
                delta: "{}".into(),
            },
            AgentEvent::ToolCallResult {
                tool_call_id: "never".into(),
                message_id: "m".into(),
                content: "r".into(),
            },
            AgentEvent::StepFinished { name: "x".into() },
            AgentEvent::TextStart {
                message_id: "m1".into(),
            },
            AgentEvent::TextDelta {
                message_id: "m1".into(),
                delta: String::new(),
            },
            AgentEvent::TextStart {
                message_id: "m1".into(),
            },
        ],
        Ending::Finished {
            result: None,
            usage: Vec::new(),
        },
    );
    assert_eq!(
        types(&out),
        [
            "RUN_STARTED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_END",
            "RUN_FINISHED"
        ]
    );
}

#[test]
fn exactly_one_terminal_event() {
    let mut t = Translator::new("t", "r");
    let mut out = Vec::new();
    t.finish(
        Ending::Error {
            code: "E".into(),
            message: "m".into(),
        },
        &mut out,
    );
    t.finish(
        Ending::Finished {
            result: None,
            usage: Vec::new(),
        },
        &mut out,
    );
    t.translate(
        AgentEvent::TextDelta {
            message_id: "m".into(),
            delta: "late".into(),
        },
        &mut out,
    );
    assert_eq!(types(&out), ["RUN_STARTED", "RUN_ERROR"]);
}

#[test]
fn result_closes_its_open_tool_call_first() {
    let out = run(
        vec![
            AgentEvent::ToolCallStart {
                tool_call_id: "c".into(),
                name: "f".into(),
                parent_message_id: None,
            },
            AgentEvent::ToolCallResult {
                tool_call_id: "c".into(),
                message_id: "m".into(),
                content: "ok".into(),
            },
            AgentEvent::ToolCallResult {
                tool_call_id: "c".into(),
                message_id: "m2".into(),
                content: "again".into(),
            },
        ],
        Ending::Finished {
            result: None,
            usage: Vec::new(),
        },
    );
    assert_eq!(
        types(&out),
        [
            "RUN_STARTED",
            "TOOL_CALL_START",
            "TOOL_CALL_END",
            "TOOL_CALL_RESULT",
            "RUN_FINISHED"
        ]
    );
}

#[test]
fn produced_transcript_accumulates_text() {
    let mut t = Translator::new("t", "r");
    let mut out = Vec::new();
    for d in ["a", "b"] {
        t.translate(
            AgentEvent::TextDelta {
                message_id: "m".into(),
                delta: d.into(),
            },
            &mut out,
        );
    }
    assert_eq!(
        t.produced(),
        [Produced::Text {
            id: "m".into(),
            content: "ab".into()
        }]
    );
}

#[test]
fn a_message_a_park_cut_goes_on_under_an_id_of_its_own_and_is_cut_again_by_its_agent_id() {
    let delta = |text: &str| AgentEvent::TextDelta {
        message_id: "m1".into(),
        delta: text.into(),
    };
    let mut first = Translator::new("t", "r1");
    let mut out = Vec::new();
    first.translate(delta("one "), &mut out);
    assert_eq!(first.open_messages(), ["m1"]);

    let mut second = Translator::new("t", "r2");
    second.carry("m1", 2);
    let mut out = Vec::new();
    second.translate(delta("two"), &mut out);
    let ids: Vec<&str> = out
        .iter()
        .filter_map(|event| match event {
            Event::TextMessageStart { message_id, .. } => Some(message_id.as_str()),
            Event::TextMessageContent { message_id, .. } => Some(message_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, ["m1~2", "m1~2"]);
    // Cut again, it is named by the agent's id, so the next segment carries it on.
    assert_eq!(second.open_messages(), ["m1"]);
}
