//! The audit's reads: streams the log (entries and payload openings) and then every row
//! people read through [`countersign_core::audit::Audit`], in pages, so memory grows
//! with the number of requests and not with the log's length. `countersign log verify`,
//! the scheduled audit in `serve`, and the crash harness run this.

use std::collections::HashMap;

use countersign_core::PayloadOpening;
use countersign_core::audit::{Audit, Difference};
use countersign_core::rooms::{Member, Room};

use crate::rows::decode_request;
use crate::{Store, StoreError, StoredEvent, kinds};

/// How many entries, payloads or requests one read fetches.
pub const PAGE: usize = 10_000;
/// Documents of one kind read at once (accounts, rooms and members are few).
const DOC_LIMIT: usize = 10_000_000;

/// What the audit found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuditReport {
    /// Entries replayed.
    pub entries: u64,
    /// Rows compared.
    pub rows: u64,
    pub differences: Vec<Difference>,
}

impl AuditReport {
    pub fn ok(&self) -> bool {
        self.differences.is_empty()
    }
}

/// Replays the whole log and compares every row with it.
pub async fn run(store: &dyn Store) -> Result<AuditReport, StoreError> {
    run_with(store, &mut drop).await
}

/// [`run`], handing each page of entries to `on_entries` once replayed (in order, once),
/// so that a caller checking the Merkle tree reads the log only once (and may do so, and
/// free the page, on another thread).
pub async fn run_with(
    store: &dyn Store,
    on_entries: &mut (dyn FnMut(Vec<StoredEvent>) + Send),
) -> Result<AuditReport, StoreError> {
    let mut audit = Audit::new();
    let mut early = Vec::new();
    // The next page is read (by the backend's reader) while this one is replayed.
    let mut pending = read_page(store, 0).await?;
    loop {
        let (page, raws) = pending;
        let Some(last) = page.last().map(|e| e.seq) else {
            break;
        };
        let replay = async {
            // Let the read of the next page start first.
            tokio::task::yield_now().await;
            let mut openings: HashMap<u64, PayloadOpening> = HashMap::with_capacity(raws.len());
            for raw in raws {
                let payload = serde_json::from_str(&raw.payload).unwrap_or_else(|e| {
                    early.push(Difference::new(
                        "payloads",
                        raw.seq.to_string(),
                        format!("does not read as JSON: {e}"),
                    ));
                    serde_json::Value::Null
                });
                openings.insert(
                    raw.seq,
                    PayloadOpening {
                        salt: raw.salt,
                        payload,
                    },
                );
            }
            for event in &page {
                audit.push(event.seq, &event.entry, openings.get(&event.seq));
            }
            on_entries(page);
        };
        let (next, ()) = tokio::join!(read_page(store, last), replay);
        pending = next?;
    }

    let mut after = String::new();
    loop {
        let page = store.requests_after(&after, PAGE).await?;
        let Some(last) = page.last() else {
            break;
        };
        after = last.id.clone();
        for raw in &page {
            match decode_request(&raw.body) {
                Ok(request) => {
                    if request.id != raw.id {
                        audit.unreadable_request(
                            &raw.id,
                            format!("its body is request {}", request.id),
                        );
                        continue;
                    }
                    early.extend(column_differences(raw, &request));
                    audit.request(&request);
                }
                Err(e) => audit.unreadable_request(&raw.id, format!("its body does not read: {e}")),
            }
        }
    }

    for token in store.list_tokens().await? {
        audit.token(&token);
    }
    for doc in store.doc_list(kinds::USER, "", DOC_LIMIT).await? {
        audit.user(&doc.id, &doc.body);
    }
    for doc in store.doc_list(kinds::GRANT, "", DOC_LIMIT).await? {
        let id = doc.key.clone().unwrap_or(doc.id);
        audit.grant(&id, &doc.body);
    }
    for doc in store.doc_list(kinds::ROOM, "", DOC_LIMIT).await? {
        match serde_json::from_value::<Room>(doc.body) {
            Ok(room) if room.name == doc.id => audit.room(&room),
            Ok(room) => early.push(Difference::new(
                "rooms",
                doc.id,
                format!("its body is room {}", room.name),
            )),
            Err(e) => early.push(Difference::new(
                "rooms",
                doc.id,
                format!("its body does not read: {e}"),
            )),
        }
    }
    for doc in store.doc_list(kinds::MEMBER, "", DOC_LIMIT).await? {
        match serde_json::from_value::<Member>(doc.body) {
            Ok(member) => audit.member(&member.room, &member.id),
            Err(e) => early.push(Difference::new(
                "members",
                doc.id,
                format!("its body does not read: {e}"),
            )),
        }
    }
    let (entries, rows) = audit.counts();
    early.extend(audit.finish());
    Ok(AuditReport {
        entries,
        rows,
        differences: early,
    })
}

/// A page of entries after `after`, with the payload openings they have.
async fn read_page(
    store: &dyn Store,
    after: u64,
) -> Result<(Vec<StoredEvent>, Vec<crate::RawPayload>), StoreError> {
    let page = store.events_after(after, PAGE).await?;
    let raws = match (page.first(), page.last()) {
        (Some(first), Some(last)) => store.payloads_between(first.seq, last.seq).await?,
        _ => Vec::new(),
    };
    Ok((page, raws))
}

/// The columns a request is queried by must say what its body says, or listings and
/// the expiry sweeper would see another request than the one shown.
fn column_differences(
    raw: &crate::RawRequest,
    request: &countersign_core::ApprovalRequest,
) -> Vec<Difference> {
    let agree = u64::try_from(raw.version).ok() == Some(request.version)
        && raw.status == request.status.as_str()
        && raw.requested_by == request.requested_by.id
        && raw.idempotency_key == request.idempotency_key
        && raw.requested_at == request.requested_at.millis()
        && raw.expires_at == request.expires_at.millis();
    if agree {
        return Vec::new();
    }
    let checks = [
        (
            "version",
            raw.version.to_string(),
            request.version.to_string(),
        ),
        (
            "status",
            raw.status.clone(),
            request.status.as_str().to_string(),
        ),
        (
            "requested_by",
            raw.requested_by.clone(),
            request.requested_by.id.clone(),
        ),
        (
            "idempotency_key",
            format!("{:?}", raw.idempotency_key),
            format!("{:?}", request.idempotency_key),
        ),
        (
            "requested_at",
            raw.requested_at.to_string(),
            request.requested_at.millis().to_string(),
        ),
        (
            "expires_at",
            raw.expires_at.to_string(),
            request.expires_at.millis().to_string(),
        ),
    ];
    checks
        .into_iter()
        .filter(|(_, column, body)| column != body)
        .map(|(name, column, body)| {
            Difference::new(
                "requests",
                &raw.id,
                format!("its {name} column is {column}, its body says {body}"),
            )
        })
        .collect()
}
