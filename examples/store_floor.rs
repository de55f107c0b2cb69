//! What a short run's two durable commits cost on their own: the embedded store as the
//! daemon drives it (its API, its runner on the blocking pool, group commit), with no HTTP,
//! no journal, no agent.
//!
//! For each of `--runs` sequential runs, each on a new thread as the benchmark's short runs
//! are, it times what the daemon awaits before `RUN_STARTED` (the thread, its input and the
//! run, committed) and before `RUN_FINISHED` (the answer and the run's end, committed), and
//! prints one JSON line per measure: p50/p99 of each and of both together, the runs per
//! second they allow, and the process's CPU per run. Set against a bare server's time to
//! first event and whole run from the same machine, it is the floor that commit-then-announce
//! puts under agui-serve's short runs.
//!
//! ```sh
//! cargo build --release --example store_floor && target/release/examples/store_floor --runs 5000
//! ```

use std::time::{Duration, Instant};

use agui_serve::protocol::Message;
use agui_serve::store::Store;
use serde_json::json;

fn message(value: serde_json::Value) -> Message {
    serde_json::from_value(value).expect("a valid message")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// The process's user and system CPU so far, in seconds.
fn cpu_seconds() -> f64 {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .expect("getrusage");
    let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    seconds(usage.user_time()) + seconds(usage.system_time())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One short run's store work on a new thread: (time to the start's commit, to the end's).
async fn run(store: &Store, n: usize) -> (Duration, Duration) {
    let id = uuid::Uuid::new_v4();
    let key = format!("bench\u{1f}floor-{id}");
    let run_id = format!("run-{n}");
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    };
    let user = message(json!({"id": format!("m-{id}"), "role": "user", "content": "hello"}));
    let began = Instant::now();
    store.record_run_start(
        &key,
        "demo",
        Some("hello".to_owned()),
        &run_id,
        vec![user],
        now(),
    );
    store.commit().await.expect("start committed");
    let started = began.elapsed();
    let answer = message(json!({"id": format!("a-{id}"), "role": "assistant",
                                "content": "You said: hello"}));
    let ending = Instant::now();
    store.record_messages(&key, vec![answer], now());
    store.record_run_end(&key, &run_id, "finished", "idle", now());
    store.commit().await.expect("end committed");
    (started, ending.elapsed())
}

fn main() {
    let mut runs = 5000usize;
    let mut dir = std::env::var_os("BENCH_TMP")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "target".into());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--runs" => runs = args.next().and_then(|v| v.parse().ok()).expect("--runs N"),
            "--dir" => dir = args.next().expect("--dir PATH").into(),
            other => panic!("unknown argument {other} (--runs N, --dir PATH)"),
        }
    }
    let data = dir.join(format!("store-floor-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&data).expect("data dir");
    // The daemon's runtime: tokio's default of one worker per core.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let store = Store::open(&data).expect("store");
        for n in 0..runs.min(200) {
            run(&store, n).await;
        }
        let (mut start, mut end, mut both) = (Vec::new(), Vec::new(), Vec::new());
        let cpu = cpu_seconds();
        let began = Instant::now();
        for n in 0..runs {
            let (s, e) = run(&store, n).await;
            start.push(ms(s));
            end.push(ms(e));
            both.push(ms(s + e));
        }
        let seconds = began.elapsed().as_secs_f64();
        let cpu_ms = (cpu_seconds() - cpu) / runs as f64 * 1e3;
        for v in [&mut start, &mut end, &mut both] {
            v.sort_by(f64::total_cmp);
        }
        let line = |measure: &str, value: f64, unit: &str| {
            println!(
                "{}",
                json!({"scenario": "store-floor", "measure": measure, "value": value,
                       "unit": unit, "runs": runs})
            );
        };
        for (name, sorted) in [("start", &start), ("end", &end), ("both", &both)] {
            line(
                &format!("{name}_commit_p50_ms"),
                percentile(sorted, 50.0),
                "ms",
            );
            line(
                &format!("{name}_commit_p99_ms"),
                percentile(sorted, 99.0),
                "ms",
            );
        }
        line("store_runs_per_s", runs as f64 / seconds, "runs/s");
        line("store_cpu_ms_per_run", cpu_ms, "cpu ms/run");
    });
    let _ = std::fs::remove_dir_all(&data);
}
