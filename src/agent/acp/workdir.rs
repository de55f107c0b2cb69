//! Where an ACP agent's sessions work: a thread's own workspace (made from the agent's
//! source before its first session, the same path after a restart, copied by a fork,
//! removed with the thread), or, for an agent without workspaces, the one directory every
//! session shares. Around each turn: which files the turn changed (a `CUSTOM`
//! `agui.workspace.changed` event) and the workspace's quota.
//!
//! The file work is blocking and runs on tokio's blocking pool.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::Inner;
use crate::agent::Turn;
use crate::agent::{AgentError, AgentEvent, EventSink, SinkClosed};
use crate::workspace::{Snapshot, Unit, Workspaces};

/// The `CUSTOM` event naming the files a turn changed.
pub(super) const CHANGED_EVENT: &str = "agui.workspace.changed";
/// How often a running turn's workspace is measured against its quota.
const QUOTA_CHECK: Duration = Duration::from_secs(2);

/// A turn's view of its workspace.
pub(super) struct TurnWorkspace {
    dir: PathBuf,
    /// The agent home of the thread's principal, which counts against the quota too.
    home: PathBuf,
    before: Option<Snapshot>,
    workspaces: Workspaces,
    /// The thread's key and the checkpoint taken before the turn, if one was.
    checkpoint: Option<(String, String)>,
    /// Cancelled when the workspace grows past its quota during the turn.
    pub(super) over_quota: CancellationToken,
    watch: CancellationToken,
}

impl Drop for TurnWorkspace {
    fn drop(&mut self) {
        self.watch.cancel();
    }
}

impl Inner {
    /// The working directory of thread `thread_key`'s sessions, made if it is new.
    pub(super) async fn workdir(&self, thread_key: &str) -> Result<PathBuf, AgentError> {
        let Some(workspaces) = self.workspaces.clone() else {
            return Ok(self.shared_dir());
        };
        let (principal, thread) = crate::access::split_key(thread_key);
        let (principal, thread) = (principal.to_owned(), thread.to_owned());
        tokio::task::spawn_blocking(move || {
            let dir = workspaces.resolve(&principal, &thread);
            workspaces.prepare(&dir).map(|()| dir)
        })
        .await
        .map_err(|e| AgentError::Backend(format!("workspace: {e}")))?
        .map_err(|e| AgentError::Failed {
            code: "WORKSPACE_UNAVAILABLE".to_owned(),
            message: format!("cannot make the thread's workspace: {e}"),
        })
    }

    /// The workspace of thread `thread_key` (the spare it adopted, or its own), made or
    /// not; `None` for an agent without workspaces.
    pub(super) async fn thread_dir(&self, thread_key: &str) -> Option<PathBuf> {
        let workspaces = self.workspaces.clone()?;
        let (principal, thread) = crate::access::split_key(thread_key);
        let (principal, thread) = (principal.to_owned(), thread.to_owned());
        let own = workspaces.dir_for(&principal, &thread);
        tokio::task::spawn_blocking(move || workspaces.resolve(&principal, &thread))
            .await
            .ok()
            .or(Some(own))
    }

    /// The directory of sessions that belong to no thread (the readiness probe's, a
    /// listing's): the operator's workspaces, or the agent's `cwd`.
    pub(super) fn shared_dir(&self) -> PathBuf {
        match &self.workspaces {
            Some(workspaces) => {
                let dir = workspaces.principal_dir("");
                if let Err(error) = std::fs::create_dir_all(&dir) {
                    tracing::warn!(%error, "cannot make the operator's workspace directory");
                }
                dir
            }
            None => self
                .config
                .cwd
                .clone()
                .or_else(|| std::env::current_dir().ok())
                .unwrap_or_else(|| "/".into()),
        }
    }

    /// Removes a deleted thread's workspace (a principal's shared one stays).
    pub(super) async fn remove_workspace(&self, thread_key: &str) {
        let Some(workspaces) = self.workspaces.clone() else {
            return;
        };
        if workspaces.config().unit != Unit::Thread {
            return;
        }
        let (principal, thread) = crate::access::split_key(thread_key);
        let (principal, thread) = (principal.to_owned(), thread.to_owned());
        let key = thread_key.to_owned();
        // Its checkpoints go with it.
        let removed = tokio::task::spawn_blocking(move || {
            if let Some(checkpoints) = workspaces.checkpoints() {
                checkpoints.remove(&key)?;
            }
            workspaces.remove_thread(&principal, &thread)
        })
        .await;
        let error = match removed {
            Ok(Ok(())) => return,
            Ok(Err(error)) => error.to_string(),
            Err(error) => error.to_string(),
        };
        tracing::warn!(agent = %self.name, %error, "cannot remove a deleted thread's workspace");
    }

    /// Copies thread `from`'s workspace for its fork `to`.
    pub(super) async fn fork_workspace(&self, from: &str, to: &str) -> Result<(), String> {
        let Some(workspaces) = self.workspaces.clone() else {
            return Ok(());
        };
        if workspaces.config().unit != Unit::Thread {
            return Ok(());
        }
        let (from, to) = (from.to_owned(), to.to_owned());
        tokio::task::spawn_blocking(move || {
            let (principal, thread) = crate::access::split_key(&from);
            let from = workspaces.resolve(principal, thread);
            let (principal, thread) = crate::access::split_key(&to);
            let to = workspaces.dir_for(principal, thread);
            if !from.exists() {
                workspaces.prepare(&from)?;
            }
            workspaces.fork(&from, &to)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot copy the workspace: {e}"))
    }

    /// What a turn watches: its workspace's files before it (and a checkpoint of them,
    /// where the thread's workspace is its own), and the quota while it runs.
    pub(super) async fn turn_workspace(&self, turn: &Turn) -> Option<TurnWorkspace> {
        let thread_key = turn.thread_id.as_str();
        let workspaces = self.workspaces.as_ref()?;
        let dir = self.thread_dir(thread_key).await?;
        let home = self.home(crate::access::split_key(thread_key).0);
        let at = dir.clone();
        let before = tokio::task::spawn_blocking(move || Snapshot::take(&at))
            .await
            .ok()?;
        let checkpoint = checkpoint_before(workspaces, turn, &dir).await;
        let (over_quota, watch) = (CancellationToken::new(), CancellationToken::new());
        if workspaces.config().quota.is_some() {
            tokio::spawn(watch_quota(
                workspaces.clone(),
                [dir.clone(), home.clone()],
                over_quota.clone(),
                watch.clone(),
            ));
        }
        Some(TurnWorkspace {
            dir,
            home,
            before: Some(before),
            workspaces: workspaces.clone(),
            checkpoint,
            over_quota,
            watch,
        })
    }
}

impl TurnWorkspace {
    /// After the turn: the files it changed, as a `CUSTOM` event when there are any; then
    /// the quota, a breach of which fails the turn.
    pub(super) async fn finish(
        mut self,
        sink: &EventSink,
    ) -> Result<Result<(), AgentError>, SinkClosed> {
        let (dir, before) = (self.dir.clone(), self.before.take());
        if let Some((thread, name)) = self.checkpoint.take() {
            record(
                &self.workspaces,
                thread,
                format!("{name}-after"),
                dir.clone(),
                String::new(),
            )
            .await;
        }
        let changed = match before {
            Some(before) => tokio::task::spawn_blocking(move || before.changed(&dir))
                .await
                .unwrap_or_default(),
            None => Vec::new(),
        };
        if !changed.is_empty() {
            sink.send(AgentEvent::Custom {
                name: CHANGED_EVENT.to_owned(),
                value: json!({ "files": changed }),
            })
            .await?;
        }
        let trees = [self.dir.clone(), self.home.clone()];
        Ok(match over_quota(&self.workspaces, &trees).await {
            true => Err(quota_error(self.workspaces.config().quota.unwrap_or(0))),
            false => Ok(()),
        })
    }
}

/// The checkpoint of `dir` before `turn`, named by the time, saying which run and which
/// message it comes before: the thread's key and its name, when it was taken.
async fn checkpoint_before(
    workspaces: &Workspaces,
    turn: &Turn,
    dir: &std::path::Path,
) -> Option<(String, String)> {
    workspaces.checkpoints()?;
    let name = crate::clock::now_ms().to_string();
    // The user message the turn answers; else the input that resumed it (a tool result).
    let message = turn
        .new_messages
        .iter()
        .rev()
        .find(|m| m.role() == "user")
        .or_else(|| turn.new_messages.first())
        .map(|m| m.id().to_owned());
    let about = json!({"runId": turn.run_id, "messageId": message}).to_string();
    let thread = turn.thread_id.clone();
    let recorded = record(
        workspaces,
        thread.clone(),
        name.clone(),
        dir.to_owned(),
        about,
    )
    .await;
    if recorded {
        keep_newest(workspaces, thread.clone()).await;
    }
    recorded.then_some((thread, name))
}

/// Lets go of the thread's oldest checkpoints past what its agent keeps (the retention,
/// `[agents.workspace] checkpoints`). A failure is logged: the turn goes on.
async fn keep_newest(workspaces: &Workspaces, thread: String) {
    let Some(checkpoints) = workspaces.checkpoints().cloned() else {
        return;
    };
    let turns = workspaces.config().checkpoints;
    let pruned = tokio::task::spawn_blocking(move || checkpoints.keep_newest(&thread, turns)).await;
    match pruned {
        Ok(Ok(0)) => {}
        Ok(Ok(gone)) => tracing::debug!(gone, "old checkpoints let go"),
        Ok(Err(error)) => tracing::warn!(%error, "old checkpoints not let go"),
        Err(error) => tracing::warn!(%error, "old checkpoints not let go"),
    }
}

/// Records checkpoint `name` of `thread`'s workspace `dir`; whether it was. A failure is
/// logged: the turn goes on without it.
async fn record(
    workspaces: &Workspaces,
    thread: String,
    name: String,
    dir: PathBuf,
    about: String,
) -> bool {
    let Some(checkpoints) = workspaces.checkpoints().cloned() else {
        return false;
    };
    let recorded =
        tokio::task::spawn_blocking(move || checkpoints.record(&thread, &name, &dir, &about)).await;
    match recorded {
        Ok(Ok(_)) => true,
        Ok(Err(error)) => {
            tracing::warn!(%error, "no checkpoint of the workspace");
            false
        }
        Err(error) => {
            tracing::warn!(%error, "no checkpoint of the workspace");
            false
        }
    }
}

/// The error a quota breach ends the run with.
pub(super) fn quota_error(quota: u64) -> AgentError {
    AgentError::Failed {
        code: "WORKSPACE_QUOTA".to_owned(),
        message: format!("the thread's workspace grew past its quota of {quota} bytes"),
    }
}

/// [`Workspaces::over_quota`] of a workspace and its agent home (`[dir, home]`) on the
/// blocking pool (a failure to run it counts as over).
async fn over_quota(workspaces: &Workspaces, trees: &[PathBuf; 2]) -> bool {
    let (workspaces, [dir, home]) = (workspaces.clone(), trees.clone());
    tokio::task::spawn_blocking(move || workspaces.over_quota(&dir, Some(&home)))
        .await
        .unwrap_or(true)
}

/// Cancels `over` once the workspace and agent home `trees` are over their quota; ends
/// with `stop`.
async fn watch_quota(
    workspaces: Workspaces,
    trees: [PathBuf; 2],
    over: CancellationToken,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(QUOTA_CHECK) => {}
        }
        if over_quota(&workspaces, &trees).await {
            over.cancel();
            return;
        }
    }
}

/// Between turns too: stops `process` (and so whatever it left writing in the background)
/// once its workspace `trees` are over the quota while no turn of it runs (a running
/// turn's own watch ends that turn with the quota's error, then this stops the process).
/// Ends with the process.
pub(super) async fn watch_process_quota(
    inner: std::sync::Weak<Inner>,
    process: std::sync::Weak<super::process::AcpProcess>,
    workspaces: Workspaces,
    trees: [PathBuf; 2],
) {
    loop {
        let exited = match process.upgrade() {
            Some(process) if process.is_alive() => process.exited.clone(),
            _ => return,
        };
        tokio::select! {
            () = exited.cancelled() => return,
            () = tokio::time::sleep(QUOTA_CHECK) => {}
        }
        let Some(process) = process.upgrade() else {
            return;
        };
        let idle = process.active.load(std::sync::atomic::Ordering::SeqCst) == 0;
        if idle && over_quota(&workspaces, &trees).await {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            tracing::warn!(
                agent = %inner.name,
                workspace = %trees[0].display(),
                "the workspace is over its quota between turns: the agent process is stopped"
            );
            inner.health.breached(|b| &mut b.quota);
            inner.forget_process(&process);
            process.stop().await;
            return;
        }
    }
}
