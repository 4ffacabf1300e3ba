//! The load: agents create requests (some replaying an idempotency key), record actions
//! and outcomes, and cancel; approvers race each other to decide. Every answer is booked
//! in the ledger; an answer that contradicts an earlier one is a violation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use super::ledger::{AckedDecision, Ledger, Req, Shared};
use super::{Rng, lock};

/// An HTTP answer, or none (the connection died with the server).
enum Answer {
    Got(u16, Value),
    None,
}

async fn post(http: &reqwest::Client, url: String, token: &str, body: &Value) -> Answer {
    match http.post(url).bearer_auth(token).json(body).send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            match resp.bytes().await {
                Ok(bytes) => Answer::Got(
                    status,
                    serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                ),
                Err(_) => Answer::None,
            }
        }
        Err(_) => Answer::None,
    }
}

/// Answers a step did not expect: an HTTP status is a violation; no answer is counted,
/// and false tells the caller to back off (the server is gone).
fn unexpected(l: &mut Ledger, what: &str, answer: Answer) -> bool {
    match answer {
        Answer::Got(code, v) => {
            l.violation(format!("{what}: unexpected HTTP {code}: {v}"));
            true
        }
        Answer::None => {
            l.unanswered_ops += 1;
            false
        }
    }
}

/// One cycle's load on one server: its tasks share the ledger and stop together.
pub(crate) struct Load {
    pub(crate) http: reqwest::Client,
    pub(crate) base: String,
    pub(crate) agents: Vec<String>,
    pub(crate) approvers: Vec<String>,
    pub(crate) executor: String,
    pub(crate) ledger: Shared,
    pub(crate) stop: Arc<AtomicBool>,
}

fn digest_of(v: &Value) -> String {
    v["action_digest"].as_str().unwrap_or_default().to_string()
}

impl Load {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Posts to request `id`'s `endpoint` (`actions`, `outcome`, `cancel`, `decision`).
    async fn post_to(&self, id: &str, endpoint: &str, token: &str, body: &Value) -> Answer {
        let url = self.url(&format!("/api/v1/requests/{id}/{endpoint}"));
        post(&self.http, url, token, body).await
    }

    /// The first of `agent`'s requests (by id) that `pick` accepts.
    fn first_of(&self, agent: usize, pick: impl Fn(&Req) -> bool) -> Option<String> {
        lock(&self.ledger)
            .reqs
            .iter()
            .find(|(_, r)| r.agent == agent && pick(r))
            .map(|(id, _)| id.clone())
    }

    pub(crate) async fn agent(self: Arc<Self>, agent: usize, mut rng: Rng) {
        let token = self.agents[agent].clone();
        while !self.stop.load(Ordering::Relaxed) {
            let roll = rng.below(100);
            let alive = if roll < 55 {
                self.create(agent, &token, &mut rng).await
            } else if roll < 80 {
                self.act(agent, &token).await
            } else if roll < 92 {
                self.outcome(agent, &token).await
            } else {
                self.cancel(agent, &token, &mut rng).await
            };
            if !alive {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    /// Creates a request (or retries an unanswered creation with its key). Returns false
    /// when the server did not answer.
    async fn create(&self, agent: usize, token: &str, rng: &mut Rng) -> bool {
        let retry = {
            let mut l = lock(&self.ledger);
            let at = l.unanswered.iter().position(|(a, _, _)| *a == agent);
            at.map(|at| l.unanswered.swap_remove(at))
        };
        let retried = retry.is_some();
        let (key, body) = match retry {
            Some((_, key, body)) => (key, body),
            None => {
                let mut l = lock(&self.ledger);
                let n = l.next_key[agent];
                l.next_key[agent] += 1;
                let key = format!("a{agent}-k{n}");
                let mut body = json!({
                    "action_description": format!("Deploy build {n} of agent {agent}"),
                    "action_details": {"build": n.to_string(), "agent": agent.to_string()},
                    "idempotency_key": key,
                });
                // Some expire almost at once, racing the expiry sweeper against deciders.
                if rng.chance(0.1) {
                    body["timeout_seconds"] = json!(1 + rng.below(2));
                }
                (key, body)
            }
        };
        let replay = rng.chance(0.05);
        let mut alive = true;
        for attempt in 0..(1 + usize::from(replay)) {
            let answer = post(&self.http, self.url("/api/v1/requests"), token, &body).await;
            let mut l = lock(&self.ledger);
            match answer {
                Answer::Got(code @ (200 | 201), v) => {
                    let id = v["request_id"].as_str().unwrap_or_default().to_string();
                    let known = l.by_key.get(&(agent, key.clone())).cloned();
                    match (code, known) {
                        (201, Some(earlier)) => l.violation(format!(
                            "agent {agent} key {key}: a second request {id} was created (the key already named {earlier})"
                        )),
                        (200, Some(earlier)) if earlier != id => l.violation(format!(
                            "agent {agent} key {key}: a retry returned {id}, the key names {earlier}"
                        )),
                        // A key never sent before cannot name an existing request.
                        (200, None) if attempt == 0 && !retried => l.violation(format!(
                            "agent {agent} key {key}: a first attempt returned an existing request {id}"
                        )),
                        _ => {}
                    }
                    if code == 201 {
                        l.acked.created += 1;
                    } else {
                        l.acked.idempotent_replays += 1;
                    }
                    if !l.reqs.contains_key(&id) {
                        l.by_key.insert((agent, key.clone()), id.clone());
                        l.reqs.insert(
                            id.clone(),
                            Req {
                                agent,
                                key: key.clone(),
                                digest: digest_of(&v),
                                action: json!({
                                    "action_description": body["action_description"],
                                    "action_details": body["action_details"],
                                }),
                                status: "pending".into(),
                                ..Req::default()
                            },
                        );
                        l.pending.push_back(id);
                    }
                }
                Answer::Got(code, v) => {
                    l.violation(format!(
                        "create as agent {agent} (key {key}): unexpected HTTP {code}: {v}"
                    ));
                }
                Answer::None => {
                    l.unanswered_ops += 1;
                    l.unanswered.push((agent, key.clone(), body.clone()));
                    alive = false;
                    break;
                }
            }
        }
        alive
    }

    /// Records the action of one of this agent's approved, unused requests.
    async fn act(&self, agent: usize, token: &str) -> bool {
        let Some(id) = self.first_of(agent, |r| r.status == "approved" && !r.used) else {
            return true;
        };
        let body = json!({"tool": "deploy", "details": {"target": "production"}});
        let answer = self.post_to(&id, "actions", token, &body).await;
        let mut l = lock(&self.ledger);
        match answer {
            Answer::Got(200, _) => {
                l.acked.actions += 1;
                if let Some(r) = l.reqs.get_mut(&id) {
                    if r.acted || r.redeemed {
                        let v = format!(
                            "{id}: an action was acknowledged after {}",
                            if r.acted {
                                "another action"
                            } else {
                                "a redemption"
                            }
                        );
                        l.violation(v);
                    } else {
                        r.acted = true;
                        r.used = true;
                    }
                }
            }
            // An earlier, unanswered attempt was recorded; or, in a long run, the
            // approval's validity (15 minutes) ran out before its agent got to it.
            Answer::Got(409, v)
                if v["error"]["code"] == "already_used"
                    || v["error"]["code"] == "approval_expired" =>
            {
                if let Some(r) = l.reqs.get_mut(&id) {
                    r.used = true;
                }
            }
            // No answer: try again later; it may or may not have been recorded.
            other => return unexpected(&mut l, &format!("action on {id}"), other),
        }
        true
    }

    async fn outcome(&self, agent: usize, token: &str) -> bool {
        let Some(id) = self.first_of(agent, |r| r.used && !r.has_outcome) else {
            return true;
        };
        let body = json!({"status": "succeeded", "summary": "deployed"});
        let answer = self.post_to(&id, "outcome", token, &body).await;
        let mut l = lock(&self.ledger);
        match answer {
            Answer::Got(200, _) => {
                l.acked.outcomes += 1;
                if let Some(r) = l.reqs.get_mut(&id) {
                    r.outcome = Some("succeeded".into());
                    r.has_outcome = true;
                }
            }
            // Already recorded by an earlier, unanswered attempt.
            Answer::Got(400, v)
                if v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("already recorded")) =>
            {
                if let Some(r) = l.reqs.get_mut(&id) {
                    r.has_outcome = true;
                }
            }
            other => return unexpected(&mut l, &format!("outcome of {id}"), other),
        }
        true
    }

    async fn cancel(&self, agent: usize, token: &str, rng: &mut Rng) -> bool {
        let id = {
            let l = lock(&self.ledger);
            let mine: Vec<&String> = l
                .pending
                .iter()
                .take(16)
                .filter(|id| {
                    l.reqs
                        .get(*id)
                        .is_some_and(|r| r.agent == agent && r.status == "pending")
                })
                .collect();
            rng.pick(&mine).map(|id| (*id).clone())
        };
        let Some(id) = id else { return true };
        let answer = self.post_to(&id, "cancel", token, &json!({})).await;
        let mut l = lock(&self.ledger);
        match answer {
            Answer::Got(200, v) => {
                l.acked.cancels += 1;
                if v["status"] != "cancelled" {
                    l.violation(format!(
                        "cancel of {id} answered 200 with status {}",
                        v["status"]
                    ));
                }
                if let Some(r) = l.reqs.get_mut(&id) {
                    r.cancelled = true;
                    r.status = "cancelled".into();
                }
            }
            Answer::Got(409, v) => l.lost_race(&id, &v),
            other => return unexpected(&mut l, &format!("cancel of {id}"), other),
        }
        true
    }

    /// The executor: redeems approved, unused proofs for their action, racing the
    /// agents' `record_action` (the approval's one use, whichever comes first).
    pub(crate) async fn executor(self: Arc<Self>, mut rng: Rng) {
        let token = self.executor.clone();
        while !self.stop.load(Ordering::Relaxed) {
            let picked = {
                let l = lock(&self.ledger);
                let open: Vec<(&String, &Req)> = l
                    .reqs
                    .iter()
                    .filter(|(_, r)| r.status == "approved" && !r.used && r.decision.is_some())
                    .take(8)
                    .collect();
                rng.pick(&open).map(|(id, r)| ((*id).clone(), (*r).clone()))
            };
            let Some((id, r)) = picked else {
                tokio::time::sleep(Duration::from_millis(3)).await;
                continue;
            };
            let mut body = r.action.clone();
            body["proof"] = r.decision.map(|d| d.proof).unwrap_or(Value::Null);
            let answer = post(&self.http, self.url("/api/v1/proofs/redeem"), &token, &body).await;
            let alive = self.book_redemption(&id, answer);
            if !alive {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    /// Books a redemption's answer; false when there was none.
    fn book_redemption(&self, id: &str, answer: Answer) -> bool {
        let mut l = lock(&self.ledger);
        match answer {
            Answer::Got(200, v) => {
                l.acked.redemptions += 1;
                if v["request_id"] != id || v["redeemed"] != true {
                    l.violation(format!("redemption of {id} answered {v}"));
                }
                if let Some(r) = l.reqs.get_mut(id) {
                    if r.acted || r.redeemed {
                        let v = format!(
                            "{id}: a redemption was acknowledged after {}",
                            if r.acted {
                                "an action"
                            } else {
                                "another redemption"
                            }
                        );
                        l.violation(v);
                    } else {
                        r.redeemed = true;
                        r.used = true;
                    }
                }
                true
            }
            // Used by the agent (or an earlier, unanswered redemption), or its
            // validity ran out.
            Answer::Got(409, v)
                if v["error"]["code"] == "already_used"
                    || v["error"]["code"] == "approval_expired" =>
            {
                if let Some(r) = l.reqs.get_mut(id) {
                    r.used = true;
                }
                true
            }
            other => unexpected(&mut l, &format!("redemption of {id}"), other),
        }
    }

    pub(crate) async fn approver(self: Arc<Self>, approver: usize, mut rng: Rng) {
        let token = self.approvers[approver].clone();
        while !self.stop.load(Ordering::Relaxed) {
            // Among the oldest few pending requests, so approvers collide often.
            let id = {
                let mut l = lock(&self.ledger);
                while let Some(front) = l.pending.front() {
                    if l.reqs.get(front).is_some_and(|r| r.status == "pending") {
                        break;
                    }
                    l.pending.pop_front();
                }
                let open: Vec<String> = l
                    .pending
                    .iter()
                    .filter(|id| l.reqs.get(*id).is_some_and(|r| r.status == "pending"))
                    .take(4)
                    .cloned()
                    .collect();
                rng.pick(&open).cloned()
            };
            let Some(id) = id else {
                tokio::time::sleep(Duration::from_millis(2)).await;
                continue;
            };
            let verdict = if rng.chance(0.6) {
                "approved"
            } else {
                "rejected"
            };
            let body = json!({"decision": verdict, "comment": format!("by approver {approver}")});
            let answer = self.post_to(&id, "decision", &token, &body).await;
            if self.record_decision(approver, verdict, &id, answer) {
                continue;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Books a decision's answer; false when there was none.
    fn record_decision(&self, approver: usize, verdict: &str, id: &str, answer: Answer) -> bool {
        let mut l = lock(&self.ledger);
        match answer {
            Answer::Got(200, v) => {
                l.acked.decisions += 1;
                let decision = AckedDecision {
                    status: v["status"].as_str().unwrap_or_default().to_string(),
                    approver: v["decision"]["approvers"][0]["id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    proof: v["proof"].clone(),
                };
                if decision.status != verdict
                    || decision.approver != format!("token:approver-{approver}")
                {
                    l.violation(format!(
                        "{id}: decided {verdict} as approver-{approver}, answered {} by {}",
                        decision.status, decision.approver
                    ));
                }
                if let Some(r) = l.reqs.get_mut(id) {
                    if let Some(earlier) = &r.decision {
                        let v = format!(
                            "{id}: two decisions acknowledged: {} by {} and {} by {}",
                            earlier.status, earlier.approver, decision.status, decision.approver
                        );
                        l.violation(v);
                    } else {
                        r.status = decision.status.clone();
                        r.decision = Some(decision);
                    }
                }
            }
            Answer::Got(409, v) => l.lost_race(id, &v),
            other => return unexpected(&mut l, &format!("decision on {id}"), other),
        }
        true
    }
}
