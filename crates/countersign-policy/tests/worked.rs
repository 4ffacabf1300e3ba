//! The ten worked policies of docs/policies.md, loaded from the page itself, and the
//! requests they describe: every effect and every annotation, through Cedar.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use countersign_policy::{Input, OnTimeout, Outcome, PolicyFile, PolicySet, RESOURCE};

fn blocks() -> Vec<String> {
    let page = include_str!("../../../docs/policies.md");
    let section = page
        .split("## Ten worked policies")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the section is there");
    section
        .split("```cedar\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap_or_default().to_string())
        .collect()
}

fn worked_set() -> PolicySet {
    let blocks = blocks();
    assert_eq!(blocks.len(), 10, "ten worked policies");
    PolicySet::load(vec![PolicyFile {
        name: "worked.cedar".into(),
        text: blocks.join("\n"),
    }])
    .unwrap_or_else(|e| panic!("{e}"))
}

struct Req {
    agent: &'static str,
    groups: Vec<String>,
    tool: Option<&'static str>,
    gateway: bool,
    description: &'static str,
    details: BTreeMap<String, String>,
    room: Option<&'static str>,
    now: DateTime<Utc>,
    recent: u64,
}

fn req(tool: Option<&'static str>, details: &[(&str, &str)]) -> Req {
    Req {
        agent: "bot",
        groups: Vec::new(),
        tool,
        gateway: false,
        description: "do a thing",
        details: details
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        room: None,
        // A Tuesday, 11:00 in Paris.
        now: "2026-12-01T10:00:00Z".parse().unwrap(),
        recent: 0,
    }
}

fn eval(set: &PolicySet, r: &Req) -> countersign_policy::Evaluation {
    set.evaluate(&Input {
        agent: r.agent,
        groups: &r.groups,
        tool: r.tool,
        resource: RESOURCE,
        gateway: r.gateway,
        description: r.description,
        details: &r.details,
        room: r.room,
        now: r.now,
        zone: chrono_tz::Europe::Paris,
        pending: 0,
        recent: r.recent,
    })
}

fn approve(policy: &str) -> Outcome {
    Outcome::Approve {
        policy: policy.into(),
    }
}

fn reject(policy: &str) -> Outcome {
    Outcome::Reject {
        policy: policy.into(),
    }
}

#[test]
fn permits_approve_and_forbids_reject() {
    let set = worked_set();
    // 1: small refunds pass; large ones, or amounts that are not numbers, go to a person.
    let small = eval(&set, &req(Some("refund"), &[("amount", "99.99")]));
    assert_eq!(small.outcome, approve("small-refunds"));
    assert_eq!(small.matched, ["small-refunds"]);
    assert_eq!(
        eval(&set, &req(Some("refund"), &[("amount", "100")])).outcome,
        Outcome::NoMatch
    );
    assert_eq!(
        eval(&set, &req(Some("refund"), &[("amount", "ten")])).outcome,
        Outcome::NoMatch
    );
    assert_eq!(
        eval(&set, &req(Some("refund"), &[])).outcome,
        Outcome::NoMatch
    );
    // Another tool with the same details: the refund policy does not apply.
    assert_eq!(
        eval(&set, &req(Some("pay"), &[("amount", "5")])).outcome,
        Outcome::NoMatch
    );

    // 2: deletes at 11:00 on a Tuesday go to a person; at 19:00 or on a Sunday, refused.
    let mut delete = req(Some("delete"), &[]);
    assert_eq!(eval(&set, &delete).outcome, Outcome::NoMatch);
    delete.now = "2026-12-01T18:30:00Z".parse().unwrap(); // 19:30 in Paris
    assert_eq!(
        eval(&set, &delete).outcome,
        reject("no-deletes-after-hours")
    );
    delete.now = "2026-12-06T10:00:00Z".parse().unwrap(); // a Sunday
    assert_eq!(
        eval(&set, &delete).outcome,
        reject("no-deletes-after-hours")
    );

    // 3: groups: an intern's agent is refused production, others are not.
    let mut prod = req(Some("deploy"), &[("env", "production")]);
    // (held for two people from sre by the tenth)
    assert!(matches!(eval(&set, &prod).outcome, Outcome::Person { .. }));
    prod.groups = vec!["interns".into()];
    assert_eq!(
        eval(&set, &prod).outcome,
        reject("interns-not-in-production")
    );

    // 4: a read-only tool passes through the gateway, not on the agent's word.
    let mut read = req(Some("read_file"), &[("path", "/etc/hosts")]);
    assert_eq!(eval(&set, &read).outcome, Outcome::NoMatch);
    read.gateway = true;
    assert_eq!(
        eval(&set, &read).outcome,
        approve("read-only-through-the-gateway")
    );
    let mut list = req(Some("list_files"), &[]);
    list.gateway = true;
    assert_eq!(
        eval(&set, &list).outcome,
        approve("read-only-through-the-gateway")
    );

    // 7: a forbid beats a permit: a small refund from a runaway agent is refused.
    let mut runaway = req(Some("refund"), &[("amount", "5")]);
    runaway.recent = 50;
    let e = eval(&set, &runaway);
    assert_eq!(e.outcome, reject("runaway-agent"));

    // 8: the description, whatever the tool (here none: Action::"request").
    let mut drop = req(None, &[]);
    drop.description = "run DROP DATABASE customers";
    assert_eq!(eval(&set, &drop).outcome, reject("no-drop-database"));
}

#[test]
fn requirement_annotations_send_requests_to_people() {
    let set = worked_set();
    // 5: large payments: two hours, then refused.
    let e = eval(&set, &req(Some("pay"), &[("amount", "25000")]));
    match &e.outcome {
        Outcome::Person {
            policies,
            requirements,
        } => {
            assert_eq!(policies, &["large-payments"]);
            assert_eq!(requirements.timeout_hours, Some(2.0));
            assert_eq!(requirements.on_timeout, Some(OnTimeout::Reject));
        }
        other => panic!("{other:?}"),
    }
    // 6: staging deploys from CI: 15 minutes, then approved; not from outside the group.
    let mut staging = req(Some("deploy"), &[("env", "staging")]);
    assert_eq!(eval(&set, &staging).outcome, Outcome::NoMatch);
    staging.groups = vec!["ci".into()];
    let e = eval(&set, &staging);
    let Outcome::Person { requirements, .. } = &e.outcome else {
        panic!("{e:?}")
    };
    assert_eq!(requirements.timeout_hours, Some(0.25));
    assert_eq!(requirements.on_timeout, Some(OnTimeout::Approve));

    // 9 with 6: the strictest wins: 15 minutes, and the incident room's policy says
    // nothing of timeouts, so the deploy is not approved when nobody answers.
    staging.room = Some("incident-42");
    let e = eval(&set, &staging);
    let Outcome::Person {
        policies,
        requirements,
    } = &e.outcome
    else {
        panic!("{e:?}")
    };
    assert_eq!(policies, &["incident-room", "staging-deploys"]);
    assert_eq!(requirements.timeout_hours, Some(0.25));
    assert_eq!(requirements.on_timeout, None);

    // 9 with 1: a permit without requirements matched alongside one with requirements
    // does not approve: a person decides within 30 minutes.
    let mut refund = req(Some("refund"), &[("amount", "5")]);
    refund.room = Some("incident-7");
    let e = eval(&set, &refund);
    assert_eq!(e.matched, ["incident-room", "small-refunds"]);
    let Outcome::Person { requirements, .. } = &e.outcome else {
        panic!("{e:?}")
    };
    assert_eq!(requirements.timeout_hours, Some(0.5));
}

#[test]
fn production_deploys_need_two_from_sre() {
    let set = worked_set();
    let mut deploy = req(Some("deploy"), &[("env", "production")]);
    deploy.now = "2026-12-01T10:00:00Z".parse().unwrap();
    let e = eval(&set, &deploy);
    assert!(
        e.matched.contains(&"production-deploys".to_string()),
        "{e:?}"
    );
    let Outcome::Person {
        requirements,
        policies,
    } = &e.outcome
    else {
        panic!("{e:?}")
    };
    assert!(
        policies.contains(&"production-deploys".to_string()),
        "{policies:?}"
    );
    assert_eq!(requirements.approvals, Some(2));
    assert_eq!(requirements.approvers, vec!["sre".to_string()]);
    // A staging deploy is not covered by it.
    let staging = eval(&set, &req(Some("deploy"), &[("env", "staging")]));
    assert!(
        !staging.matched.contains(&"production-deploys".to_string()),
        "{staging:?}"
    );
}

#[test]
fn a_forbid_that_cannot_be_evaluated_keeps_a_permit_from_approving() {
    // Overflow is an evaluation error strict validation cannot rule out.
    let set = PolicySet::load(vec![PolicyFile {
        name: "p.cedar".into(),
        text: r#"
            @id("all") permit(principal, action, resource);
            @id("overflow") forbid(principal, action, resource)
              when { context.number has n && context.number.n * 4 > 0 };
        "#
        .into(),
    }])
    .unwrap_or_else(|e| panic!("{e}"));
    let ok = eval(&set, &req(None, &[("n", "1")]));
    assert_eq!(ok.outcome, reject("overflow"));
    let fine = eval(&set, &req(None, &[]));
    assert_eq!(fine.outcome, approve("all"));
    let overflow = eval(&set, &req(None, &[("n", "9223372036854775807")]));
    assert!(
        matches!(overflow.outcome, Outcome::Person { .. }),
        "{overflow:?}"
    );
    assert_eq!(overflow.errors.len(), 1, "{overflow:?}");
    assert!(overflow.errors[0].starts_with("overflow:"), "{overflow:?}");
}

#[test]
fn an_empty_set_matches_nothing() {
    let set = PolicySet::load(Vec::new()).unwrap_or_else(|e| panic!("{e}"));
    assert!(set.is_empty());
    assert_eq!(
        eval(&set, &req(Some("refund"), &[("amount", "1")])).outcome,
        Outcome::NoMatch
    );
}

#[test]
fn the_published_schema_is_the_one_policies_are_checked_against() {
    let published = include_str!("../../../docs/countersign.cedarschema");
    assert_eq!(published, countersign_policy::base_schema());
}
