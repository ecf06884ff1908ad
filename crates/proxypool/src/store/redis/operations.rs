//! The pool's operations on the shared store: acquire and release through the batch queue,
//! abandon, sessions, membership, probes and the snapshot read.

use std::sync::{Arc, PoisonError};

use rand::RngCore;
use redis::Value;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::batch::{Job, Queue};
use super::encoding::{Arg, lease_member, parse_ops, success_latency, text};
use super::lost::Lost;
use super::stale::{Open, RECOVERING};
use super::verdicts::SiteFacts;

use crate::address::ProxyAddress;
use crate::clock::{Timestamp, millis};
use crate::error::{AcquireError, PoolError};
use crate::health::window::Class;
use crate::lease::{LeaseId, Outcome};
use crate::snapshot::Snapshot;
use crate::state::LeaseRef;
use crate::store::{Grant, Release};
use crate::strategy::consistent_hash::{fingerprint, key_hash, points};
use crate::ticket::Ticket;

use super::{
    AcquireRequest, Answer, Facts, NO_SITE, Op, RedisStore, ReleaseRequest, SharedView, TO_52_BITS,
    unavailable,
};

impl RedisStore {
    fn site_id(&self, site: &Arc<str>) -> u32 {
        let mut sites = self.sites.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&id) = sites.ids.get(site) {
            return id;
        }
        sites.names.push(Arc::clone(site));
        let id = u32::try_from(sites.names.len()).unwrap_or(u32::MAX);
        sites.ids.insert(Arc::clone(site), id);
        id
    }

    pub(super) fn site_name(&self, id: u32) -> Arc<str> {
        let sites = self.sites.lock().unwrap_or_else(PoisonError::into_inner);
        id.checked_sub(1)
            .and_then(|i| sites.names.get(i as usize))
            .cloned()
            .unwrap_or_else(|| Arc::from(NO_SITE))
    }

    /// The address with this id: from memory, or read once from Redis by `deadline`.
    pub(super) async fn address(&self, id: u32, deadline: Instant) -> Result<ProxyAddress, String> {
        let (known, generation) = {
            let cache = self
                .addresses
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            (cache.1.get(&id).cloned(), cache.0)
        };
        if let Some(a) = known {
            return Ok(a);
        }
        let mut cmd = redis::cmd("HGET");
        cmd.arg(&self.url_key).arg(id);
        let reply = self
            .by(deadline, self.query(&cmd))
            .await
            .map_err(|e| unavailable(&e))?;
        let address = text(&reply)
            .and_then(|u| ProxyAddress::parse(&u).ok())
            .ok_or_else(|| format!("no address with id {id} in Redis"))?;
        let mut cache = self
            .addresses
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        // Not if the cache was cleared meanwhile: the answer may predate a loss of the pool.
        if cache.0 == generation {
            cache.1.insert(id, address.clone());
        }
        Ok(address)
    }

    /// Sends `request` with the next batch of its queue and waits for its answer, at most the
    /// timeout.
    async fn batched<R, O>(
        &self,
        queue: &Queue<R, Result<O, String>>,
        request: R,
        deadline: Instant,
    ) -> Result<O, String> {
        let (reply, answer) = oneshot::channel();
        queue
            .send(Job { request, reply })
            .map_err(|_| "the store's batch worker has stopped (its runtime is gone)".to_owned())?;
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err("the store's batch worker has stopped (its runtime is gone)".into()),
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
        }
    }

    pub(crate) async fn acquire(
        &self,
        ticket: &Ticket,
        now: Timestamp,
    ) -> Result<Grant, AcquireError> {
        let pool = match &ticket.sub_pool {
            None => Arc::clone(&self.whole),
            Some(name) => self
                .sub_pools
                .get(&**name)
                .cloned()
                .ok_or_else(|| AcquireError::UnknownSubPool(name.to_string()))?,
        };
        let key = ticket.key.as_deref().unwrap_or("");
        // Drawn here, in call order, as the memory store draws it when it picks.
        let seed = if key.is_empty() && pool.starts_with('l') {
            self.rng
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .next_u32()
        } else {
            0
        };
        let request = AcquireRequest {
            now,
            pool,
            key: key.to_owned(),
            point: if key.is_empty() {
                0
            } else {
                key_hash(key) >> TO_52_BITS
            },
            site: ticket.site.clone().unwrap_or_else(|| Arc::from(NO_SITE)),
            seed,
        };
        // One deadline for the whole acquire: the batch and, the first time an id is seen,
        // reading its address.
        let deadline = self.deadline();
        let reply = match self
            .batched(&self.ops, Op::Acquire(request), deadline)
            .await
            .map_err(AcquireError::StoreUnavailable)?
        {
            Answer::Acquired(reply) => reply,
            Answer::Released(_) | Answer::Settled => {
                return Err(AcquireError::StoreUnavailable("malformed ops reply".into()));
            }
        };
        let address = |id| async move {
            self.address(id, deadline)
                .await
                .map_err(AcquireError::StoreUnavailable)
        };
        let choice = match (reply.refusal, reply.choice) {
            (None, Some(choice)) => choice,
            (Some("broken"), _) => {
                return Err(AcquireError::SessionBroken {
                    key: key.to_owned(),
                    address: address(reply.id).await?,
                });
            }
            (Some("cooling"), _) => {
                return Err(AcquireError::BoundAddressCooling {
                    key: key.to_owned(),
                    address: address(reply.id).await?,
                    // The library puts the cooling's end where a grant's lease id goes.
                    retry_in: Timestamp::from_millis(reply.lease).since(now),
                });
            }
            (Some("busy"), _) => {
                return Err(AcquireError::BoundAddressBusy {
                    key: key.to_owned(),
                    address: address(reply.id).await?,
                });
            }
            _ => return Err(AcquireError::NoAddressAvailable),
        };
        let lease = LeaseRef::shared(LeaseId(reply.lease));
        match address(reply.id).await {
            Ok(address) => Ok(Grant {
                lease,
                slot: reply.id,
                site: ticket.site.as_ref().map_or(0, |s| self.site_id(s)),
                address,
                choice,
            }),
            Err(e) => {
                // Granted but unusable: give the slot back now rather than after the TTL.
                self.abandon(lease, reply.id, now);
                Err(e)
            }
        }
    }

    pub(crate) async fn release(&self, release: Release, now: Timestamp) -> Result<(), PoolError> {
        let site = self.site_name(release.site);
        let class = match release.outcome {
            Outcome::Success { .. } => "s",
            // A block is the site's judgement of the address, not the address's health.
            Outcome::Blocked if release.site != 0 => "b",
            Outcome::ConnectError | Outcome::Timeout | Outcome::Blocked => "f",
            Outcome::Captcha => "c",
            Outcome::RateLimited { .. } => "r",
        };
        let cool_until = match release.outcome {
            // A site's Retry-After is not trusted beyond the longest quarantine wait.
            Outcome::RateLimited { retry_after } => now
                .as_millis()
                .saturating_add(millis(retry_after.min(self.cfg.backoff.cap))),
            _ => 0,
        };
        // What enters the address's window, as memory classes it (a rate limit does not).
        let windowed = match release.outcome {
            // Capped as the windows cap it.
            Outcome::Success { latency } => Some((
                Class::Success,
                u16::try_from(millis(latency)).unwrap_or(u16::MAX),
            )),
            Outcome::ConnectError | Outcome::Timeout | Outcome::Blocked => {
                Some((Class::Failure, 0))
            }
            Outcome::Captcha => Some((Class::Captcha, 0)),
            Outcome::RateLimited { .. } => None,
        };
        let (level, success) = match windowed {
            Some((class, ms)) => {
                let noted = self
                    .latencies
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .note(release.slot, class, ms, &self.cfg.health, now);
                let success = (class == Class::Success).then_some((ms, noted.slow));
                (noted.level, success)
            }
            None => (None, None),
        };
        let request = ReleaseRequest {
            now,
            lease: release.lease.id.0,
            id: release.slot,
            class,
            site,
            cool_until,
            level,
            success,
        };
        let answer = self
            .batched(&self.ops, Op::Release(request), self.deadline())
            .await
            .map_err(PoolError::StoreUnavailable)?;
        // News for the judge: its decision is a second call (transitions are rare).
        if let Answer::Released(Some(facts)) = answer {
            self.judge(*facts, now)
                .await
                .map_err(PoolError::StoreUnavailable)?;
        }
        Ok(())
    }

    /// Queued with the releases, unanswered. Should it be lost (no runtime, Redis down), the
    /// lease TTL frees the slot.
    pub(crate) fn abandon(&self, lease: LeaseRef, slot: u32, now: Timestamp) {
        drop(self.queue_abandon(lease.id.0, slot, now));
    }

    /// From a lease's `Drop`: [`Self::abandon`], the store kept until the abandon's batch has
    /// run (by a task, where a runtime is at hand). Dropped with its last lease, the store
    /// would stop its batch worker, and the abandon with it.
    pub(crate) fn abandon_kept(self: &Arc<Self>, lease: LeaseRef, slot: u32, now: Timestamp) {
        let answer = self.queue_abandon(lease.id.0, slot, now);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let store = Arc::clone(self);
            runtime.spawn(async move {
                let _ = answer.await;
                drop(store);
            });
        }
    }

    /// Gives back grants made for callers that left; `open` is finished once the batches
    /// carrying them have run (or failed: then only the lease TTL frees them).
    pub(super) fn give_back(&self, grants: Vec<(u64, u32)>, now: Timestamp, open: Open) {
        let answers: Vec<_> = grants
            .into_iter()
            .map(|(lease, slot)| self.queue_abandon(lease, slot, now))
            .collect();
        tokio::spawn(async move {
            for answer in answers {
                let _ = answer.await;
            }
            drop(open);
        });
    }

    /// [`Self::abandon`], awaited: done once Redis has it, or failed (then the lease TTL frees
    /// the slot).
    pub(crate) async fn abandon_settled(
        &self,
        lease: LeaseRef,
        slot: u32,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        let request = Op::Release(abandon_request(lease.id.0, slot, now));
        self.batched(&self.ops, request, self.deadline())
            .await
            .map(drop)
            .map_err(PoolError::StoreUnavailable)
    }

    /// Queues the abandon of `lease` with the releases; the receiver hears when its batch is
    /// done.
    fn queue_abandon(
        &self,
        lease: u64,
        slot: u32,
        now: Timestamp,
    ) -> oneshot::Receiver<Result<Answer, String>> {
        let (reply, answer) = oneshot::channel();
        let _ = self.ops.send(Job {
            request: Op::Release(abandon_request(lease, slot, now)),
            reply,
        });
        answer
    }

    /// One FCALL for a batch of releases and acquires (releases first: they may free what
    /// the acquires need), at the latest `now` among them.
    pub(super) async fn ops_batch(self: Arc<Self>, jobs: Vec<Job<Op, Result<Answer, String>>>) {
        let mut releases = Vec::new();
        let mut acquires = Vec::new();
        // Answered when this batch is done (the worker ran every earlier batch first).
        let mut settles = Vec::new();
        for job in jobs {
            match job.request {
                Op::Settle => settles.push(job.reply),
                Op::Release(r) => releases.push((r, job.reply)),
                // Callers that gave up (timed out, cancelled) must not take leases. (A release
                // goes out whatever: an abandon has no caller.)
                Op::Acquire(_) if job.reply.is_closed() => {}
                Op::Acquire(r) => acquires.push((r, job.reply)),
            }
        }
        let Some(now) = releases
            .iter()
            .map(|(r, _)| r.now)
            .chain(acquires.iter().map(|(r, _)| r.now))
            .max()
        else {
            for reply in settles {
                let _ = reply.send(Ok(Answer::Settled));
            }
            return;
        };
        // The acquires' lease ids, this process's own: a lost reply can be looked up by them.
        let ids = match acquires.len() {
            0 => None,
            n => self.lease_ids(n as u64, now).await,
        };
        let lease_deadline = now.as_millis().saturating_add(millis(self.cfg.lease_ttl));
        let mut args = Vec::with_capacity(6 + releases.len() * 5 + acquires.len() * 5);
        args.extend([
            Arg::Int(lease_deadline),
            Arg::Int(now.as_millis().saturating_add(millis(self.cfg.sticky_ttl))),
            Arg::Float(self.cfg.load_factor),
            Arg::Int(releases.len() as u64),
            Arg::Int(ids.as_ref().map_or(0, |ids| ids.first)),
            Arg::Str(ids.as_ref().map_or("", |ids| &ids.epoch)),
        ]);
        // Each lease's member in `due`, made here rather than in the script (where a string
        // costs about as much as a command).
        let members: Vec<String> = releases
            .iter()
            .map(|(r, _)| lease_member(r.lease, r.id))
            .collect();
        let latencies: Vec<String> = releases
            .iter()
            .map(|(r, _)| r.success.map_or_else(String::new, success_latency))
            .collect();
        for (((r, _), member), latency) in releases.iter().zip(&members).zip(&latencies) {
            args.extend([
                Arg::Str(member),
                Arg::Int(u64::from(r.id)),
                Arg::Str(r.class),
                Arg::Str(&r.site),
                // A rate limit's cooling end or a success's latency level: never both.
                match (r.class, r.level) {
                    ("r", _) => Arg::Int(r.cool_until),
                    (_, Some(level)) => Arg::Signed(level),
                    _ => Arg::Str(""),
                },
                Arg::Str(latency),
            ]);
        }
        for (r, _) in &acquires {
            args.extend([
                Arg::Str(&r.key),
                Arg::Int(r.point),
                Arg::Str(&r.site),
                Arg::Str(&r.pool),
                Arg::Int(u64::from(r.seed)),
            ]);
        }
        // Before the call leaves: whether grants for callers that left may precede it.
        let mark = self.stale.mark();
        // (A clone: `args` borrows the epoch.)
        let lost = ids.clone().map(|ids| Lost {
            ids,
            lease_deadline,
        });
        let reply = self
            .late_safe_call(&args, now, acquires.len(), lost)
            .await
            .and_then(|v| parse_ops(v, acquires.len()).ok_or_else(|| "malformed ops reply".into()));
        match reply {
            Ok(ops) => {
                self.note_more(ops.more);
                self.note_epoch(ops.epoch, now);
                let mut facts: Vec<Option<Box<Facts>>> = vec![None; releases.len()];
                for (j, f) in ops.facts {
                    if let Some(slot) = j.checked_sub(1).and_then(|j| facts.get_mut(j)) {
                        *slot = Some(Box::new(f));
                    }
                }
                // Sites first, as in memory: a conviction excuses the outcomes of its stretch,
                // and the addresses that had them are judged on their windows read again.
                if !ops.sites.is_empty() {
                    match self.judge_sites(&ops.sites, now).await {
                        Ok(again) => {
                            for (j, excused) in again {
                                let f = j.checked_sub(1).and_then(|j| facts.get_mut(j));
                                if let Some(f) = f.and_then(Option::as_mut) {
                                    f.site_changed(excused);
                                }
                            }
                        }
                        Err(e) => {
                            tracing::warn!(target: "proxypool::redis", error = %e, "sites not judged");
                        }
                    }
                }
                for ((_, reply), facts) in releases.into_iter().zip(facts) {
                    let _ = reply.send(Ok(Answer::Released(facts)));
                }
                let mut left = Vec::new();
                let mut refused = Vec::new();
                for ((_, reply), r) in acquires.into_iter().zip(ops.acquires) {
                    if r.choice.is_none() {
                        refused.push((reply, r));
                    } else if let Err(Ok(Answer::Acquired(r))) = reply.send(Ok(Answer::Acquired(r)))
                    {
                        // A caller that left meanwhile: its grant goes straight back.
                        left.push((r.lease, r.id));
                    }
                }
                if !left.is_empty() {
                    self.give_back(left, now, self.stale.open());
                }
                // Once every grant of the batch is delivered or going back: a refusal for
                // want of a free address may be the doing of grants not back yet.
                let suspect = self.stale.suspect(mark);
                for (reply, r) in refused {
                    let _ = reply.send(match r.refusal {
                        Some("none" | "busy") if suspect => Err(RECOVERING.to_owned()),
                        _ => Ok(Answer::Acquired(r)),
                    });
                }
            }
            Err(e) => {
                if releases.iter().any(|(r, _)| r.class == "a") {
                    tracing::warn!(target: "proxypool::redis", error = %e, "abandon lost; the lease TTL frees it");
                }
                for (_, reply) in releases {
                    let _ = reply.send(Err(e.clone()));
                }
                for (_, reply) in acquires {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
        for reply in settles {
            let _ = reply.send(Ok(Answer::Settled));
        }
    }

    /// The batch's FCALL, bounded by the timeout. A reply coming later is still read, by a
    /// task the call moves to: a server that was paused runs the calls queued meanwhile when
    /// it thaws, and the grants in them, whose callers were told the store is unavailable, go
    /// straight back instead of holding caps until their TTL; until they are back, refusals
    /// are suspect (see `stale`). (That task keeps the store alive until the reply or the
    /// connection's response timeout, the lease TTL.) A call that fails, at once or late, may
    /// have run all the same: its grants (`lost`, by their ids) are looked for and given back
    /// once Redis answers again (see `lost`).
    async fn late_safe_call(
        self: &Arc<Self>,
        args: &[Arg<'_>],
        now: Timestamp,
        acquires: usize,
        lost: Option<Lost>,
    ) -> Result<Value, String> {
        let cmd = self.fcall(&self.functions.ops, now, self.claim_sweep(now), args);
        let me = Arc::clone(self);
        let mut call = Box::pin(async move { me.send(&cmd).await });
        match tokio::time::timeout_at(self.deadline(), &mut call).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => {
                if let Some(lost) = lost {
                    self.reclaim(lost, now, self.stale.open());
                }
                Err(unavailable(&e))
            }
            Err(_) => {
                if acquires > 0 {
                    let me = Arc::clone(self);
                    let open = self.stale.open();
                    tokio::spawn(async move {
                        let ops = call.await.ok().and_then(|late| parse_ops(late, acquires));
                        match (ops, lost) {
                            (Some(ops), _) => {
                                let grants =
                                    ops.acquires.into_iter().filter(|r| r.choice.is_some());
                                me.give_back(grants.map(|r| (r.lease, r.id)).collect(), now, open);
                            }
                            (None, Some(lost)) => me.reclaim(lost, now, open),
                            (None, None) => {}
                        }
                    });
                }
                Err(format!("no answer within {:?}", self.timeout))
            }
        }
    }

    pub(crate) async fn end_session(&self, key: &str, now: Timestamp) -> bool {
        match self
            .call(&self.functions.end_session, now, true, &[Arg::Str(key)])
            .await
        {
            Ok(reply) => matches!(reply, Value::Int(1)),
            Err(e) => {
                tracing::warn!(target: "proxypool::redis", error = %e, "end_session failed");
                false
            }
        }
    }

    /// Adds `address` to the whole pool and `sub_pools` unless it is there: every process
    /// may add the same start list.
    pub(crate) async fn add_idempotent(
        &self,
        address: &ProxyAddress,
        sub_pools: &[String],
        now: Timestamp,
    ) -> Result<bool, PoolError> {
        let mut names: Vec<&str> = Vec::with_capacity(sub_pools.len());
        for name in sub_pools {
            if !self.sub_pools.contains_key(name) {
                return Err(PoolError::UnknownSubPool(name.clone()));
            }
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
        let names = names.join(" ");
        let url = address.as_str();
        let token = format!("{:016x}", rand::random::<u64>());
        let mut args = vec![
            Arg::Str(url),
            Arg::Str(address.redacted()),
            Arg::Int(fingerprint(url) >> TO_52_BITS),
            Arg::Str(&token),
            Arg::Str(&names),
        ];
        args.extend(points(url, self.cfg.ring_vnodes).map(|p| Arg::Int(p >> TO_52_BITS)));
        let reply = self
            .call(&self.functions.add, now, true, &args)
            .await
            .map_err(|e| PoolError::StoreUnavailable(unavailable(&e)))?;
        self.added
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(url.to_owned(), (address.clone(), sub_pools.to_vec()));
        Ok(matches!(reply, Value::Int(1)))
    }

    pub(crate) async fn add(
        &self,
        address: ProxyAddress,
        sub_pools: &[String],
        now: Timestamp,
    ) -> Result<(), PoolError> {
        if self.add_idempotent(&address, sub_pools, now).await? {
            Ok(())
        } else {
            Err(PoolError::Duplicate(address))
        }
    }

    pub(crate) async fn remove(
        &self,
        address: &ProxyAddress,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        let reply = self
            .call(
                &self.functions.remove,
                now,
                true,
                &[Arg::Str(address.as_str())],
            )
            .await
            .map_err(|e| PoolError::StoreUnavailable(unavailable(&e)))?;
        self.added
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(address.as_str());
        // Its id is not given again in this epoch: its outcomes here are of no more use.
        let id = self
            .addresses
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .iter()
            .find_map(|(id, a)| (a == address).then_some(*id));
        if let Some(id) = id {
            self.latencies
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .forget(id);
        }
        if matches!(reply, Value::Int(1)) {
            Ok(())
        } else {
            Err(PoolError::UnknownAddress(address.clone()))
        }
    }

    pub(crate) async fn report_probe(
        &self,
        address: &ProxyAddress,
        passed: bool,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        let args = [
            Arg::Str(address.as_str()),
            Arg::Str(if passed { "1" } else { "0" }),
        ];
        let reply = self
            .call(&self.functions.probe, now, true, &args)
            .await
            .map_err(|e| PoolError::StoreUnavailable(unavailable(&e)))?;
        match reply {
            Value::Int(1) => Ok(()),
            Value::Int(_) => Err(PoolError::UnknownAddress(address.clone())),
            reply => {
                let malformed = || PoolError::StoreUnavailable("malformed probe reply".into());
                let Value::Array(items) = reply else {
                    return Err(malformed());
                };
                let [record, sites] = items.as_slice() else {
                    return Err(malformed());
                };
                let (_, mut facts) = Facts::parse(record).ok_or_else(malformed)?;
                let sites = SiteFacts::parse_all(sites).ok_or_else(malformed)?;
                if let Some(id) = facts.failed_probe_in_service() {
                    self.latencies
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .note(id, Class::Failure, 0, &self.cfg.health, now);
                }
                // A failure in service is an outcome at the site of tickets without one.
                let again = self.judge_sites(&sites, now).await;
                if let Some((_, excused)) = again.map_err(PoolError::StoreUnavailable)?.first() {
                    facts.site_changed(*excused);
                }
                self.judge(facts, now)
                    .await
                    .map_err(PoolError::StoreUnavailable)
            }
        }
    }

    /// The raw shared state, one round trip.
    pub(crate) async fn read(&self, now: Timestamp) -> Result<SharedView, String> {
        let reply = self
            .call(&self.functions.snapshot, now, true, &[])
            .await
            .map_err(|e| unavailable(&e))?;
        let view = SharedView::parse(reply, now, &self.cfg).ok_or("malformed snapshot reply")?;
        self.telemetry.observe(&view);
        Ok(view)
    }

    /// Returns once every operation this process queued before the call has reached Redis (a
    /// dropped lease's abandon among them).
    pub(crate) async fn settle(&self) -> Result<(), PoolError> {
        self.batched(&self.ops, Op::Settle, self.deadline())
            .await
            .map(drop)
            .map_err(PoolError::StoreUnavailable)
    }

    pub(crate) async fn snapshot(&self, now: Timestamp) -> Snapshot {
        // This process's queued operations first (a dropped lease's abandon among them); a
        // queue that does not answer in time leaves the read to say so.
        let _ = self.settle().await;
        match self.read(now).await {
            Ok(view) => view.snapshot,
            Err(e) => {
                // The snapshot API has no error: an empty one, and the reason in the log.
                tracing::warn!(target: "proxypool::redis", error = %e, "snapshot failed");
                SharedView::empty(now).snapshot
            }
        }
    }
}

/// A release without an outcome: the lease was dropped, the work's result is unknown.
fn abandon_request(lease: u64, slot: u32, now: Timestamp) -> ReleaseRequest {
    ReleaseRequest {
        now,
        lease,
        id: slot,
        class: "a",
        site: Arc::from(NO_SITE),
        cool_until: 0,
        level: None,
        success: None,
    }
}
