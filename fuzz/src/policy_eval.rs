//! Policy evaluation: countersign's answer for a request equals Cedar's over every
//! policy for the action.
//!
//! `PolicySet::evaluate` skips policies by an index and settles the tests policies start
//! with (groups, thresholds, `has`, equality) without Cedar (countersign-policy's
//! `index.rs` and `prefilter.rs`). The input builds up to 8 policies from a grammar of
//! those tests and of what they must not be confused with (`like`, `||`, arithmetic that
//! overflows, `unless`, a second condition, `is` in the scope), with fuzzed literals,
//! then up to 8 requests with fuzzed agents, groups, tools, details (whole numbers,
//! decimals, text), rooms, times and counts. A set that does not load (a policy the
//! validator refuses) is skipped. For every request, `evaluate` must equal
//! `evaluate_by_cedar_alone`: the same outcome, the same matched policies, the same
//! errors.

use std::collections::BTreeMap;

use arbitrary::{Arbitrary, Unstructured};
use countersign_policy::{Input, PolicyFile, PolicySet};

#[derive(Debug, Arbitrary)]
struct Policy {
    forbid: bool,
    timeout: bool,
    principal: (u8, u8),
    action: (u8, u8, u8),
    resource: (u8, u8),
    when: Vec<Test>,
    unless: Option<Test>,
}

#[derive(Debug, Arbitrary)]
enum Test {
    Room(u8),
    Env(u8),
    Gateway(bool),
    Number {
        key: bool,
        op: u8,
        n: i8,
    },
    NumberEquals {
        key: bool,
        n: i8,
    },
    Decimal {
        key: bool,
        op: u8,
        whole: i16,
        frac: u16,
    },
    Time {
        field: u8,
        op: u8,
        n: u8,
    },
    Pending {
        op: u8,
        n: u8,
    },
    Like(u8),
    Overflow {
        key: bool,
    },
    Either(bool),
}

#[derive(Debug, Arbitrary)]
struct Request {
    agent: u8,
    groups: u8,
    tool: Option<u8>,
    resource: u8,
    gateway: bool,
    description: u8,
    a: Detail,
    b: Detail,
    env: Option<u8>,
    room: Option<u8>,
    minutes: u16,
    pending: u8,
}

#[derive(Debug, Arbitrary)]
enum Detail {
    Missing,
    Long(i64),
    Small(i8),
    Decimal(i16, u16),
    Text(u8),
}

const OPS: [&str; 4] = ["<", "<=", ">", ">="];
const METHODS: [&str; 4] = [
    "lessThan",
    "lessThanOrEqual",
    "greaterThan",
    "greaterThanOrEqual",
];

fn key(b: bool) -> &'static str {
    if b { "a" } else { "b" }
}

fn decimal_text(whole: i16, frac: u16) -> String {
    format!("{whole}.{}", frac % 10_000)
}

impl Test {
    fn cedar(&self) -> String {
        match self {
            Test::Room(r) => format!("context has room && context.room == \"r{}\"", r % 4),
            Test::Env(e) => format!(
                "context.input has env && context.input.env == \"e{}\"",
                e % 3
            ),
            Test::Gateway(b) => format!("context.gateway == {b}"),
            Test::Number { key: k, op, n } => {
                let k = key(*k);
                let op_text = OPS[(*op % 4) as usize];
                if op & 4 == 0 {
                    format!("context.number has {k} && context.number.{k} {op_text} {n}")
                } else {
                    format!("context.number has {k} && {n} {op_text} context.number.{k}")
                }
            }
            Test::NumberEquals { key: k, n } => {
                let k = key(*k);
                format!("context.number has {k} && context.number.{k} == {n}")
            }
            Test::Decimal {
                key: k,
                op,
                whole,
                frac,
            } => {
                let k = key(*k);
                format!(
                    "context.decimal has {k} && context.decimal.{k}.{}(decimal(\"{}\"))",
                    METHODS[(*op % 4) as usize],
                    decimal_text(*whole, *frac)
                )
            }
            Test::Time { field, op, n } => format!(
                "context.time.{} {} {}",
                ["hour", "minute", "weekday"][(*field % 3) as usize],
                OPS[(*op % 4) as usize],
                n % 61
            ),
            Test::Pending { op, n } => format!(
                "context.agent.pending {} {}",
                OPS[(*op % 4) as usize],
                n % 5
            ),
            Test::Like(x) => format!("context.description like \"*{}*\"", x % 3),
            Test::Overflow { key: k } => {
                let k = key(*k);
                format!("context.number has {k} && context.number.{k} + 9223372036854775000 > 0")
            }
            Test::Either(b) => format!("(context.gateway == {b} || context.input has env)"),
        }
    }
}

impl Policy {
    fn cedar(&self) -> String {
        let (p, pid) = self.principal;
        let principal = match p % 6 {
            0 => "principal".to_string(),
            1 => format!("principal in Group::\"g{}\"", pid % 3),
            2 => format!("principal == Agent::\"a{}\"", pid % 3),
            3 => format!("principal in Agent::\"a{}\"", pid % 3),
            4 => "principal is Agent".to_string(),
            _ => format!("principal is Agent in Group::\"g{}\"", pid % 3),
        };
        let (a, x, y) = self.action;
        let action = match a % 3 {
            0 => "action".to_string(),
            1 => format!("action == Action::\"t{}\"", x % 3),
            _ => format!("action in [Action::\"t{}\", Action::\"t{}\"]", x % 3, y % 3),
        };
        let (r, rid) = self.resource;
        let resource = match r % 4 {
            0 => "resource".to_string(),
            1 => format!("resource == Server::\"s{}\"", rid % 2),
            2 => format!("resource in Server::\"s{}\"", rid % 2),
            _ => "resource is Server".to_string(),
        };
        let mut text = String::new();
        if self.timeout && !self.forbid {
            text.push_str("@timeout_hours(\"1\") ");
        }
        text.push_str(if self.forbid { "forbid" } else { "permit" });
        text.push_str(&format!("({principal}, {action}, {resource})"));
        let when: Vec<String> = self.when.iter().take(4).map(Test::cedar).collect();
        if !when.is_empty() {
            text.push_str(&format!(" when {{ {} }}", when.join(" && ")));
        }
        if let Some(unless) = &self.unless {
            text.push_str(&format!(" unless {{ {} }}", unless.cedar()));
        }
        text.push(';');
        text
    }
}

impl Detail {
    fn text(&self) -> Option<String> {
        match self {
            Detail::Missing => None,
            Detail::Long(n) => Some(n.to_string()),
            Detail::Small(n) => Some(n.to_string()),
            Detail::Decimal(w, f) => Some(decimal_text(*w, *f)),
            Detail::Text(x) => Some(format!("x{x}")),
        }
    }
}

pub fn run(data: &[u8]) {
    // The counts first, so that any bytes make a whole case.
    let mut u = Unstructured::new(data);
    let (Ok(policies), Ok(requests)) = (u.int_in_range(1..=8u8), u.int_in_range(1..=8u8)) else {
        return;
    };
    let Ok(policies) = (0..policies)
        .map(|_| Policy::arbitrary(&mut u))
        .collect::<Result<Vec<_>, _>>()
    else {
        return;
    };
    let Ok(requests) = (0..requests)
        .map(|_| Request::arbitrary(&mut u))
        .collect::<Result<Vec<_>, _>>()
    else {
        return;
    };
    let text: Vec<String> = policies.iter().map(Policy::cedar).collect();
    let Ok(set) = PolicySet::load(vec![PolicyFile {
        name: "fuzz.cedar".into(),
        text: text.join("\n"),
    }]) else {
        return;
    };
    let day = chrono::DateTime::<chrono::Utc>::from_timestamp(1_764_547_200, 0).unwrap();
    for request in &requests {
        let agent = format!("a{}", request.agent % 3);
        let groups: Vec<String> = (0..3)
            .filter(|g| request.groups & (1 << g) != 0)
            .map(|g| format!("g{g}"))
            .collect();
        let tool = request.tool.map(|t| format!("t{}", t % 4));
        let resource = format!("s{}", request.resource % 3);
        let mut details = BTreeMap::new();
        for (name, detail) in [("a", &request.a), ("b", &request.b)] {
            if let Some(value) = detail.text() {
                details.insert(name.to_string(), value);
            }
        }
        if let Some(env) = request.env {
            details.insert("env".to_string(), format!("e{}", env % 4));
        }
        let room = request.room.map(|r| format!("r{}", r % 5));
        let description = ["drop 1", "read 2", "x0"][(request.description % 3) as usize];
        let input = Input {
            agent: &agent,
            groups: &groups,
            tool: tool.as_deref(),
            resource: &resource,
            gateway: request.gateway,
            description,
            details: &details,
            room: room.as_deref(),
            now: day + chrono::Duration::minutes(i64::from(request.minutes % 10_080)),
            zone: chrono_tz::Europe::Paris,
            pending: u64::from(request.pending % 6),
            recent: 0,
        };
        let fast = set.evaluate(&input);
        let cedar = set.evaluate_by_cedar_alone(&input);
        assert_eq!(
            fast,
            cedar,
            "policies:\n{}\nrequest: {input:?}",
            text.join("\n")
        );
    }
}
