//! The server under abuse, side by side in one run against one `countersign serve` with
//! its default timeouts and limits: sockets that send nothing, one byte, half the
//! headers or half a body, and idle keep-alive connections, while agents' long polls
//! wait; at the same time a flood of the largest evidence uploads the server accepts
//! (zip bombs just under `max_body_bytes`), while another client's calls are timed;
//! then 20 wrong passwords at once against one account, and the right one.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::client::Api;
use crate::figures::{Sample, load_average, micros};
use crate::instances::{Backend, Setup};
use crate::scale::{raise_open_files, rss_mib, sockets};

/// The server's own settings but one: sign-ins come through a "proxy" on loopback, so
/// each attempt can have an address of its own (the per-address throttle is not what
/// stops them; the per-account lockout is).
const CONFIG: &str = "[server]\ntrusted_proxies = [\"127.0.0.1\"]\n";
/// The default `max_body_bytes`: the largest upload the server reads.
const MAX_BODY: usize = 1024 * 1024;
/// How long the long polls wait: past the 15 s every abusive socket must be gone by.
const POLL_SECONDS: u64 = 20;
const PASSWORD: &str = "correct horse battery staple";

/// Kinds of sockets that never finish a request.
const KINDS: [&str; 5] = [
    "silent",
    "one byte",
    "half the headers",
    "half a body",
    "idle keep-alive",
];

fn opening(kind: &str, host: &str, token: &str) -> Vec<u8> {
    match kind {
        "silent" => Vec::new(),
        "one byte" => b"G".to_vec(),
        "half the headers" => format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\n").into_bytes(),
        "half a body" => format!(
            "POST /api/v1/requests HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{{\"action_description\": "
        )
        .into_bytes(),
        _ => format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes(),
    }
}

/// Reads until the server closes; how long that took (`None`: still open at `limit`).
async fn time_to_close(mut stream: TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        let left = limit.checked_sub(start.elapsed())?;
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
            Err(_) => return None,
        }
    }
}

/// A ZIP just under `max_bytes` whose files are zeros: about a thousand times larger
/// once inflated (a gigabyte).
fn bomb(max_bytes: usize) -> anyhow::Result<Vec<u8>> {
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    let chunk = vec![0u8; 1024 * 1024];
    // Deflate stores zeros at about 1,030 to 1; leave room for the headers.
    let files = max_bytes / (16 * 1024);
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for i in 0..files {
        zip.start_file(format!("entries/{i}.json"), options)?;
        for _ in 0..16 {
            zip.write_all(&chunk)?;
        }
    }
    let bytes = zip.finish()?.into_inner();
    if bytes.len() > max_bytes {
        bail!("the bomb came out at {} bytes", bytes.len());
    }
    Ok(bytes)
}

pub async fn abuse(
    bin: &Path,
    per_kind: usize,
    uploads: usize,
    seconds: u64,
) -> anyhow::Result<()> {
    raise_open_files(8 * per_kind as u64 + 4096)?;
    let setup = Setup::start_configured(bin, Backend::Sqlite, 1, CONFIG).await?;
    let base = setup.base(0).to_string();
    let host = base.trim_start_matches("http://").to_string();
    let pid = setup.instances[0].child.id().context("no pid")?;
    let api = Api::new(&setup)?;
    let bomb = Arc::new(bomb(MAX_BODY - 4096)?);
    let polls: Vec<String> = {
        let mut ids = Vec::new();
        for _ in 0..20 {
            ids.push(api.create(&base).await?);
        }
        ids
    };
    let probe_id = api.create(&base).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss_idle, _) = rss_mib(pid)?;
    let sockets_idle = sockets(pid);

    // ---- everything at once -------------------------------------------------------
    let start = Instant::now();
    let mut held = Vec::new();
    for kind in KINDS {
        for _ in 0..per_kind {
            let mut stream = TcpStream::connect(&host).await?;
            stream
                .write_all(&opening(kind, &host, &setup.agent))
                .await?;
            held.push((
                kind,
                tokio::spawn(time_to_close(stream, Duration::from_secs(60))),
            ));
        }
    }
    let long_polls: Vec<_> = polls
        .iter()
        .map(|id| {
            let http = reqwest::Client::builder().no_proxy().build();
            let url = format!("{base}/api/v1/requests/{id}/wait?timeout_seconds={POLL_SECONDS}");
            let token = setup.agent.clone();
            tokio::spawn(async move {
                let begun = Instant::now();
                let resp = http?.get(url).bearer_auth(token).send().await?;
                let status = resp.status().as_u16();
                let body: Value = resp.json().await?;
                anyhow::Ok((begun.elapsed(), status, body["status"].clone()))
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sockets_held = sockets(pid);

    let until = Instant::now() + Duration::from_secs(seconds);
    let refused = Arc::new(AtomicU64::new(0));
    let busy = Arc::new(AtomicU64::new(0));
    let flood: Vec<_> = (0..uploads)
        .map(|_| {
            let http = reqwest::Client::builder().no_proxy().build();
            let (url, token) = (
                format!("{base}/api/v1/evidence/verify"),
                setup.agent.clone(),
            );
            let (bomb, refused, busy) = (bomb.clone(), refused.clone(), busy.clone());
            tokio::spawn(async move {
                let http = http?;
                while Instant::now() < until {
                    let sent = http
                        .post(&url)
                        .bearer_auth(&token)
                        .body(bomb.to_vec())
                        .send()
                        .await;
                    // A busy server answers 503 before reading the body and closes the
                    // connection: the client may see only the close.
                    let resp = match sent {
                        Ok(resp) => resp,
                        Err(_) => {
                            busy.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    match resp.status().as_u16() {
                        200 => {
                            let verdict: Value = resp.json().await?;
                            if verdict["valid"] != false {
                                bail!("a bomb was not refused: {verdict}");
                            }
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        503 => {
                            busy.fetch_add(1, Ordering::Relaxed);
                            // As a client told "busy, retry in a few seconds" would.
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        other => bail!("an upload got {other}: {}", resp.text().await?),
                    }
                }
                anyhow::Ok(())
            })
        })
        .collect();
    // Another client, meanwhile: reads a request, one call at a time.
    let probe = {
        let http = reqwest::Client::builder().no_proxy().build()?;
        let url = format!("{base}/api/v1/requests/{probe_id}");
        let token = setup.agent.clone();
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < until {
                let begun = Instant::now();
                let resp = http.get(&url).bearer_auth(&token).send().await?;
                if !resp.status().is_success() {
                    bail!("the other client got {}", resp.status());
                }
                resp.bytes().await?;
                latencies.push(micros(begun.elapsed()));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            anyhow::Ok(latencies)
        })
    };
    for upload in flood {
        upload.await??;
    }
    let latencies = Sample::new(probe.await??);
    let (_, rss_peak) = rss_mib(pid)?;

    let mut closed: Vec<(&str, Vec<Option<Duration>>)> =
        KINDS.iter().map(|k| (*k, Vec::new())).collect();
    for (kind, task) in held {
        let took = task.await?;
        if let Some((_, all)) = closed.iter_mut().find(|(k, _)| *k == kind) {
            all.push(took);
        }
    }
    let sockets_after = sockets(pid);
    let mut polled = Vec::new();
    for poll in long_polls {
        polled.push(poll.await??);
    }
    let polls_ok = polled
        .iter()
        .filter(|(took, status, state)| {
            *status == 200 && state == "pending" && *took >= Duration::from_secs(POLL_SECONDS)
        })
        .count();
    let polls_shortest = polled.iter().map(|(t, _, _)| *t).min().unwrap_or_default();
    let run_secs = start.elapsed().as_secs_f64();

    // ---- 20 wrong passwords at once ------------------------------------------------
    let link = setup
        .cli(
            bin,
            &["user", "add", "--username", "ops", "--role", "admin"],
        )
        .await?;
    let invite = link
        .split_once("token=")
        .map(|(_, t)| t.trim().to_string())
        .context("no invitation link")?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let accepted = http
        .post(format!("{base}/ui/accept"))
        .json(&json!({"token": invite, "password": PASSWORD}))
        .send()
        .await?;
    if !accepted.status().is_success() {
        bail!(
            "accepting the invitation failed: {}",
            accepted.text().await?
        );
    }
    let sign_in = |from: String, username: &'static str, password: &'static str| {
        let (http, url) = (http.clone(), format!("{base}/ui/login"));
        async move {
            let resp = http
                .post(url)
                .header("x-forwarded-for", from)
                .json(&json!({"username": username, "password": password}))
                .send()
                .await?;
            let status = resp.status().as_u16();
            anyhow::Ok((status, resp.json::<Value>().await.unwrap_or(Value::Null)))
        }
    };
    let wrong = futures_util::future::join_all(
        (0..20).map(|i| sign_in(format!("203.0.113.{i}"), "ops", "not the password")),
    )
    .await;
    let wrong_refused = wrong
        .iter()
        .filter(|r| r.as_ref().is_ok_and(|(s, _)| *s == 401))
        .count();
    let (right_status, right) = sign_in("198.51.100.1".into(), "ops", PASSWORD).await?;
    let (_, unknown) = sign_in("198.51.100.2".into(), "nobody", PASSWORD).await?;
    let locked = right_status == 401;
    let alike = right == unknown;

    // ---- the figures ------------------------------------------------------------------
    println!(
        "abuse: {per_kind} sockets of each kind, {} long polls of {POLL_SECONDS} s, {uploads} uploads of {} KiB for {seconds} s (one SQLite instance, default limits)",
        polls.len(),
        bomb.len() / 1024
    );
    println!(
        "{:<22} {:>6} {:>10} {:>10} {:>10}",
        "socket", "count", "p50 s", "max s", "open@60s"
    );
    let mut all_closed_within = Duration::ZERO;
    let mut still_open = 0;
    for (kind, took) in &closed {
        let done: Vec<Duration> = took.iter().flatten().copied().collect();
        let open = took.len() - done.len();
        still_open += open;
        let sample = Sample::new(done.iter().map(|d| micros(*d)).collect());
        all_closed_within = all_closed_within.max(done.iter().copied().max().unwrap_or_default());
        println!(
            "{:<22} {:>6} {:>10.2} {:>10.2} {:>10}",
            kind,
            took.len(),
            sample.pct(0.5) / 1000.0,
            sample.max() / 1000.0,
            open
        );
    }
    let row = |name: &str, value: String| println!("{name:<52} {value:>16}");
    row(
        "long polls answered after their full wait",
        format!("{polls_ok} of {}", polled.len()),
    );
    row(
        "shortest long poll (s)",
        format!("{:.2}", polls_shortest.as_secs_f64()),
    );
    row(
        "server sockets idle / with all held / after",
        format!("{sockets_idle} / {sockets_held} / {sockets_after}"),
    );
    row(
        "uploads refused as bombs / told busy",
        format!(
            "{} / {}",
            refused.load(Ordering::Relaxed),
            busy.load(Ordering::Relaxed)
        ),
    );
    row(
        "server RSS idle / peak (MiB)",
        format!("{rss_idle:.1} / {rss_peak:.1}"),
    );
    row(
        "other client during the flood p50 / p99 / max (ms)",
        format!(
            "{:.2} / {:.2} / {:.2}",
            latencies.pct(0.5),
            latencies.pct(0.99),
            latencies.max()
        ),
    );
    row("other client's calls", latencies.0.len().to_string());
    row(
        "20 parallel wrong passwords refused",
        format!("{wrong_refused} of 20"),
    );
    row(
        "then the right password: locked",
        format!("{locked} ({right_status})"),
    );
    row("locked and unknown answered alike", alike.to_string());
    println!("load average {:.2}", load_average());
    println!(
        "{}",
        json!({
            "bench": "abuse", "per_kind": per_kind, "uploads": uploads, "seconds": seconds,
            "sockets_closed_within_s": all_closed_within.as_secs_f64(),
            "sockets_still_open": still_open,
            "long_polls_kept": polls_ok, "long_polls": polled.len(),
            "sockets_idle": sockets_idle, "sockets_held": sockets_held, "sockets_after": sockets_after,
            "bombs_refused": refused.load(Ordering::Relaxed), "uploads_busy": busy.load(Ordering::Relaxed),
            "rss_idle_mib": rss_idle, "rss_peak_mib": rss_peak,
            "other_p50_ms": latencies.pct(0.5), "other_p99_ms": latencies.pct(0.99),
            "other_max_ms": latencies.max(), "other_calls": latencies.0.len(),
            "wrong_refused": wrong_refused, "locked": locked, "alike": alike,
            "run_seconds": run_secs, "load_average": load_average(),
        })
    );
    Ok(())
}
