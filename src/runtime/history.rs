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

    /// The last `limit` messages of thread `id` of `principal` and whether older ones were
    /// left out; `None` when the principal has no such thread.
    pub async fn thread_messages(
        &self,
        principal: &Principal,
        id: &str,
        limit: usize,
    ) -> Result<Option<(Vec<Value>, bool)>, StoreError> {
        match self.visible_thread(principal, id).await? {
            Some(row) => self.store().messages(row.key.as_str(), limit).await,
            None => Ok(None),
        }
    }

    /// `principal`'s threads (every principal's for the operator), newest activity first,
    /// of `agent` if given.
    pub async fn list_threads_as(
        &self,
        principal: &Principal,
        limit: usize,
        cursor: Option<(i64, String)>,
        agent: Option<String>,
    ) -> Result<ThreadPage, StoreError> {
        let scope = ListScope {
            owner: (!principal.sees_everyone()).then(|| principal.owner().to_owned()),
            agents: principal.agents().map(<[String]>::to_vec),
        };
        self.store().list_threads(limit, cursor, agent, scope).await
    }

    /// The node that owns thread `id` of `principal`, when it is not this one (cluster).
    pub async fn owner_elsewhere_as(&self, principal: &Principal, id: &str) -> Option<Owner> {
        self.owner_elsewhere(&principal.key(id)).await
    }
}
