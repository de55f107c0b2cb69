//! What the API reads of a principal's threads: their rows, transcripts and listing, each
//! in the principal's namespace, so no handler builds a thread key or reaches the store.

use serde_json::Value;

use super::Runtime;
use crate::access::Principal;
use crate::cluster::Owner;
use crate::store::{ListScope, StoreError, ThreadPage, ThreadRow};

impl Runtime {
    /// Thread `id` of `principal`'s namespace, when it is one of an agent the principal may
    /// use (`None` otherwise, as for a thread that does not exist).
    pub async fn visible_thread(
        &self,
        principal: &Principal,
        id: &str,
    ) -> Result<Option<ThreadRow>, StoreError> {
        let row = self.store().thread(principal.key(id).as_str()).await?;
        Ok(row.filter(|row| principal.may_use(&row.agent)))
    }

    /// Renames thread `id` of `principal` (its title) and archives it or takes it out of
    /// the archive, as given; the row as it is then, committed. `None` when the principal
    /// has no such thread.
    pub async fn update_thread_as(
        &self,
        principal: &Principal,
        id: &str,
        title: Option<&str>,
        archived: Option<bool>,
    ) -> Result<Option<ThreadRow>, StoreError> {
        let Some(row) = self.visible_thread(principal, id).await? else {
            return Ok(None);
        };
        let now = crate::clock::now_ms() as i64;
        if let Some(title) = title {
            self.store().set_title(row.key.as_str(), title, now);
        }
        if let Some(archived) = archived {
            self.store().set_archived(row.key.as_str(), archived, now);
        }
        self.store().commit().await?;
        self.fleet_activity(row.owner.as_str());
        self.visible_thread(principal, id).await
    }

    /// The last `limit` messages of thread `id` of `principal` and whether older ones were
    /// left out; `None` when the principal has no such thread.
    pub async fn thread_messages(
        &self,
        principal: &Principal,
        id: &str,
        limit: usize,
    ) -> Result<Option<(Vec<Value>, bool)>, StoreError> {
        match self.visible_thread(principal, id).await? {
            Some(row) => Ok(self.store().messages(row.key.as_str(), limit).await?.map(
                |(messages, truncated)| match self.shown(&row.key, Value::Array(messages)) {
                    Value::Array(messages) => (messages, truncated),
                    _ => (Vec::new(), truncated),
                },
            )),
            None => Ok(None),
        }
    }

    /// `principal`'s threads (every principal's for the operator), newest activity first,
    /// of `agent` if given, archived ones too when `archived`.
    pub async fn list_threads_as(
        &self,
        principal: &Principal,
        limit: usize,
        cursor: Option<(i64, String)>,
        agent: Option<String>,
        archived: bool,
    ) -> Result<ThreadPage, StoreError> {
        let scope = ListScope {
            owner: (!principal.sees_everyone()).then(|| principal.owner().to_owned()),
            agents: principal.agents().map(<[String]>::to_vec),
            archived,
        };
        self.store().list_threads(limit, cursor, agent, scope).await
    }

    /// The node that owns thread `id` of `principal`, when it is not this one (cluster).
    pub async fn owner_elsewhere_as(&self, principal: &Principal, id: &str) -> Option<Owner> {
        self.owner_elsewhere(&principal.key(id)).await
    }
}
