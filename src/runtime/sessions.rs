//! An agent's own sessions as threads: listing them, importing one as a new thread (its
//! history becomes the transcript, served by hydration like any thread's), and forking a
//! thread into a new one on a forked agent session.
//!
//! A new thread is written the way a run writes one, so nothing downstream needs to know
//! where it came from: a thread row, its messages, and one run (outcome `imported` or
//! `forked`) that brought them, then the session binding; all committed before the
//! answer. The thread id is a new one, or the client's when no thread has it yet; only a
//! client that also posts a run on the id it names, at the same moment, could race the
//! writes (its run would start the thread first and the import would add to it).

use crate::access::{Principal, ThreadKey};
use crate::agent::{SessionError, SessionPage};
use crate::protocol::input::{Content, Message};
use crate::store::StoreError;

use super::run::title_of;
use super::{LoadError, Runtime};
use crate::clock::now_ms;

/// Why a session request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionRequestError {
    #[error("no such agent")]
    UnknownAgent,
    #[error("no such thread")]
    UnknownThread,
    #[error("a thread with this id exists")]
    ThreadExists,
    #[error("the thread has a live run")]
    RunInProgress,
    #[error("the server is draining")]
    Draining,
    #[error(transparent)]
    Agent(#[from] SessionError),
    #[error("the thread store is unavailable")]
    Store,
    /// Another node owns the thread (cluster).
    #[error("another node owns the thread")]
    Elsewhere(crate::cluster::Owner),
}

impl From<StoreError> for SessionRequestError {
    fn from(error: StoreError) -> SessionRequestError {
        tracing::error!(%error, "store failed during a session request");
        SessionRequestError::Store
    }
}

/// Where a fork starts: at a message (`None`: the last), and with the files as they were
/// then (else as they are now).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForkAt {
    pub message_id: Option<String>,
    pub files: bool,
}

/// A thread created from an agent session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewThread {
    pub thread_id: String,
    /// `None` for a fork at an earlier message: its first turn starts a session.
    pub session_id: Option<String>,
    pub message_count: usize,
}

impl Runtime {
    /// A page of `agent`'s own sessions.
    pub async fn agent_sessions(
        &self,
        agent: &str,
        cursor: Option<String>,
    ) -> Result<SessionPage, SessionRequestError> {
        let agent = self
            .agents()
            .get(agent)
            .ok_or(SessionRequestError::UnknownAgent)?;
        agent
            .list_sessions(cursor)
            .await
            .map_err(|e| self.agent_error(e))
    }

    /// Imports `agent`'s session `session_id` as a new thread (`thread_id`, or a new id)
    /// of `principal`'s namespace.
    pub async fn import_session(
        &self,
        principal: &Principal,
        agent_name: &str,
        session_id: &str,
        thread_id: Option<String>,
    ) -> Result<NewThread, SessionRequestError> {
        let agent = self
            .agents()
            .get(agent_name)
            .filter(|_| principal.may_use(agent_name))
            .ok_or(SessionRequestError::UnknownAgent)?;
        let thread_id = self.fresh_thread_id(principal, thread_id).await?;
        let key = principal.key(&thread_id);
        let transcript = agent
            .import_session(key.as_str(), session_id)
            .await
            .map_err(|e| self.agent_error(e))?;
        let title = transcript.iter().find_map(|m| match m {
            Message::User(user) => match &user.content {
                Content::Text(text) => Some(title_of(text)),
                parts @ Content::Parts(_) => Some(title_of(&parts.text())),
            },
            _ => None,
        });
        let message_count = transcript.len();
        self.write_thread(
            &key,
            agent_name,
            title,
            transcript,
            Some(session_id),
            "imported",
        )
        .await?;
        tracing::info!(thread.id = %thread_id, session = %session_id, "session imported as a thread");
        Ok(NewThread {
            thread_id,
            session_id: Some(session_id.to_owned()),
            message_count,
        })
    }

    /// Forks thread `source` of `principal`'s namespace into a new thread there
    /// (`thread_id`, or a new id) with the same transcript, on a session the agent forks
    /// from the thread's. At an earlier message (`at.message_id`), the transcript ends
    /// there and the fork's first turn starts a new session given it; with `at.files`, the
    /// fork's workspace is put back to the checkpoint before the turn that followed.
    pub async fn fork_thread(
        &self,
        principal: &Principal,
        source: &str,
        thread_id: Option<String>,
        at: ForkAt,
    ) -> Result<NewThread, SessionRequestError> {
        let source_key = principal.key(source);
        if let Some(owner) = self.owner_elsewhere(&source_key).await {
            return Err(SessionRequestError::Elsewhere(owner));
        }
        if self.live_status(&source_key).is_some() {
            return Err(SessionRequestError::RunInProgress);
        }
        // What the thread's last run queued is in the store before it is read.
        self.store().commit().await?;
        let stored = self
            .store()
            .load_thread(source_key.as_str())
            .await?
            .filter(|stored| principal.may_use(&stored.row.agent))
            .ok_or(SessionRequestError::UnknownThread)?;
        let agent = self
            .agents()
            .get(&stored.row.agent)
            .ok_or(SessionRequestError::UnknownAgent)?;
        let keep = match &at.message_id {
            None => stored.transcript.len(),
            Some(id) => {
                let at = stored.transcript.iter().position(|m| m.id() == id);
                at.ok_or_else(|| {
                    SessionRequestError::Agent(SessionError::NotFound(format!(
                        "the thread has no message {id:?}"
                    )))
                })? + 1
            }
        };
        let thread_id = self.fresh_thread_id(principal, thread_id).await?;
        let key = principal.key(&thread_id);
        if keep < stored.transcript.len() || at.files {
            return self
                .fork_at(
                    agent.as_ref(),
                    &source_key,
                    stored,
                    (thread_id, key),
                    keep,
                    at.files,
                )
                .await;
        }
        let session_id = agent
            .fork_session(
                source_key.as_str(),
                stored.row.session_id.as_deref(),
                key.as_str(),
            )
            .await
            .map_err(|e| self.agent_error(e))?;
        let message_count = stored.transcript.len();
        let title = stored.row.title.clone();
        self.write_thread(
            &key,
            &stored.row.agent,
            title,
            stored.transcript,
            Some(&session_id),
            "forked",
        )
        .await?;
        tracing::info!(thread.id = %thread_id, from = %source, "thread forked");
        Ok(NewThread {
            thread_id,
            session_id: Some(session_id),
            message_count,
        })
    }

    /// A fork of the first `keep` messages of `stored` (thread `source`) as thread
    /// `(id, key)`, with no session: its first turn starts one given the transcript. Its
    /// workspace is the source's as it is now, or with `files`, as it was before the turn
    /// that followed its last message.
    async fn fork_at(
        &self,
        agent: &dyn crate::agent::Agent,
        source: &ThreadKey,
        mut stored: crate::store::StoredThread,
        (thread_id, key): (String, ThreadKey),
        keep: usize,
        files: bool,
    ) -> Result<NewThread, SessionRequestError> {
        let cut = files.then(|| super::rewind::Cut::of(&stored.transcript, keep));
        super::rewind::fork_files(agent, source.as_str(), key.as_str(), cut)
            .await
            .map_err(|error| match error {
                super::RewindError::NoCheckpoints(_) => SessionRequestError::Agent(
                    SessionError::unsupported("keeps no checkpoints of its threads' files"),
                ),
                other => SessionRequestError::Agent(SessionError::Failed(other.to_string())),
            })?;
        stored.transcript.truncate(keep);
        let title = stored.row.title.clone();
        self.write_thread(
            &key,
            &stored.row.agent,
            title,
            stored.transcript,
            None,
            "forked",
        )
        .await?;
        tracing::info!(thread.id = %thread_id, kept = keep, files, "thread forked at a message");
        Ok(NewThread {
            thread_id,
            session_id: None,
            message_count: keep,
        })
    }

    /// An agent's refusal, its text sanitized like a run's errors.
    fn agent_error(&self, error: SessionError) -> SessionRequestError {
        SessionRequestError::Agent(match error {
            SessionError::Failed(message) => SessionError::Failed(self.sanitized(&message)),
            other => other,
        })
    }

    /// `requested` when no thread of `principal`'s namespace has that id, else a new id.
    async fn fresh_thread_id(
        &self,
        principal: &Principal,
        requested: Option<String>,
    ) -> Result<String, SessionRequestError> {
        if self.is_draining() {
            return Err(SessionRequestError::Draining);
        }
        let Some(id) = requested else {
            return Ok(uuid::Uuid::new_v4().to_string());
        };
        let key = principal.key(&id);
        if self.threads().get(&key).is_some() || self.store().thread(key.as_str()).await?.is_some()
        {
            return Err(SessionRequestError::ThreadExists);
        }
        Ok(id)
    }

    /// Writes a new idle thread (by key) bound to `session_id` (`None`: its first turn
    /// starts a session given the transcript, as after a rewind), and waits for the commit.
    async fn write_thread(
        &self,
        thread_id: &ThreadKey,
        agent: &str,
        title: Option<String>,
        transcript: Vec<Message>,
        session_id: Option<&str>,
        how: &str,
    ) -> Result<(), SessionRequestError> {
        match self.claim(thread_id).await {
            Ok(()) => {}
            Err(LoadError::Elsewhere(_)) => return Err(SessionRequestError::ThreadExists),
            Err(LoadError::Store) => return Err(SessionRequestError::Store),
        }
        let store = &self.store();
        let now = now_ms() as i64;
        let run_id = format!("{how}-{}", uuid::Uuid::new_v4());
        let key = thread_id.as_str();
        let created = super::notices::created(self, key, agent, None, how);
        let reported = created.is_some();
        store.record_run_start_notifying(key, agent, title, &run_id, transcript, now, created);
        store.record_run_end(key, &run_id, how, "idle", now);
        match session_id {
            Some(session_id) => store.set_session(key, session_id, how, now),
            // Nothing is cut: the thread is marked to give its transcript to a new session.
            None => store.rewind(key, None, now),
        }
        self.outgoing_queued(reported);
        store.commit().await?;
        if self.lease_lost(thread_id) {
            // Refused by the fence: nothing of it was stored.
            return Err(SessionRequestError::Store);
        }
        Ok(())
    }
}
