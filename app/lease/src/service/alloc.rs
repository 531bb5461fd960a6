//! ALLOC: checks, budgets, a slot and extents, then the build (`plan::Stage::Build`); the answer goes out when
//! the QP reaches RTS, or an HCA error when a step fails (the unwind follows, `revoke`).

use alloc::format;
use alloc::string::{String, ToString};

use leasebox_proto::{AllocReq, AllocResp, ErrorBody, ErrorCode, LeaseId, Reply, Response, access, mtu_bytes};

use super::plan::{QP_BUF, QP_DBR, Steps};
use super::{Host, LeaseService, Neighbour, Parked, RESOLVE_TIMEOUT_MS, Who, err};
use crate::lease::{Lease, Phase, Slot, Waiters};
use crate::transitions::{State, Why};

fn bad(field: &str, why: &str) -> ErrorBody {
    err(ErrorCode::BadParam, &format!("ALLOC: field '{field}' {why}"))
}

impl<T: Copy> LeaseService<T> {
    pub(super) fn alloc(
        &mut self,
        who: Who<'_>,
        a: &AllocReq,
        ticket: T,
        now_us: u64,
        host: &mut dyn Host,
    ) -> Option<Reply> {
        if let Err(e) = self.check_alloc(a) {
            return Some(Err(e));
        }
        if self.draining(who.tenant) {
            // Its leases are about to be revoked (DRAIN): a new one would only be revoked with them.
            let msg = format!("ALLOC: draining: tenant {}'s leases are being revoked (DRAIN)", who.tenant);
            return Some(Err(err(ErrorCode::Busy, &msg)));
        }
        if !who.admin
            && let Err(e) = self.take_alloc_token(who.tenant, now_us)
        {
            return Some(Err(e));
        }
        if a.client_mac == [0; 6] {
            return self.resolve(who, a, ticket, now_us, host);
        }
        let extents_needed = a.size.div_ceil(self.cfg.extent);
        let (mine, my_bytes) = self.tenant_usage(who.tenant);
        if mine >= self.cfg.tenant_leases {
            return Some(Err(err(
                ErrorCode::Limit,
                &format!("tenant has {mine} leases, the limit is {}", self.cfg.tenant_leases),
            )
            .with_detail([mine, self.cfg.tenant_leases, 0])));
        }
        let bytes = extents_needed * self.cfg.extent;
        if my_bytes.saturating_add(bytes) > self.cfg.tenant_bytes {
            return Some(Err(err(
                ErrorCode::Limit,
                &format!("tenant would hold {} bytes, the limit is {}", my_bytes + bytes, self.cfg.tenant_bytes),
            )));
        }
        if !who.admin
            && let Some((share, reserved)) = self.over_share(who.tenant, bytes)
        {
            return Some(Err(err(
                ErrorCode::Limit,
                &format!(
                    "tenant would hold {} bytes, above its fair share of {share}, and the pool's unheld bytes are \
                     other tenants' unused shares ({reserved} bytes)",
                    my_bytes + bytes
                ),
            )));
        }
        let Some(&slot) = self.free.first() else {
            return Some(Err(err(
                ErrorCode::Limit,
                &format!("all {} lease slots are in use or fenced", self.cfg.slots),
            )));
        };
        let Some(extents) = self.pool.take(extents_needed as usize) else {
            return Some(Err(err(
                ErrorCode::NoMemory,
                &format!(
                    "{} bytes asked, {} free in the pool ({} more being cleared)",
                    a.size,
                    self.pool.free_bytes(),
                    self.pool.scrubbing_bytes()
                ),
            )));
        };
        // A warm entry when one is ready and the lease fits it (the UMR path); else the six commands.
        let warm = if self.warm_fits(extents.len(), a.access) { self.take_warm() } else { None };
        let qp_buf = warm.map_or_else(|| host.dma_alloc(QP_BUF, 4096), |w| Some(w.qp_buf));
        let qp_dbr = warm.map_or_else(|| host.dma_alloc(QP_DBR, 64), |w| Some(w.qp_dbr));
        let (Some(qp_buf), Some(qp_dbr)) = (qp_buf, qp_dbr) else {
            if let Some(b) = qp_buf {
                host.dma_free(b);
            }
            if let Some(d) = qp_dbr {
                host.dma_free(d);
            }
            self.pool.give_back(&extents);
            return Some(Err(err(ErrorCode::NoMemory, "no DMA memory for the QP's work queue")));
        };
        let Slot::Free { next_generation } = self.slots[slot as usize] else { return None };
        let id = LeaseId { boot_id: self.boot_id, slot, generation: next_generation };
        let mtu = a.mtu.min(self.hca.port_mtu);
        let ttl_ms = if a.ttl_ms == 0 { self.cfg.default_ttl_ms } else { a.ttl_ms };
        let server_psn = self.ids.psn();
        let lease = Lease {
            id,
            tenant: who.tenant.to_string(),
            session: Some(who.session),
            orphaned_at: None,
            last_session: who.session,
            warned: false,
            reconnects: 0,
            phase: Phase::Building,
            size: a.size,
            access: a.access,
            mtu,
            ttl_ms,
            expires_at: now_us + u64::from(ttl_ms) * 1000,
            client_qpn: a.client_qpn,
            client_psn: a.client_psn,
            client_gid: a.client_gid,
            client_mac: a.client_mac,
            server_psn,
            extents,
            qp_buf,
            qp_dbr,
            pd: warm.map(|w| w.pd),
            mkey: warm.map(|w| w.mkey),
            qpn: warm.map(|w| w.qpn),
            qp_in_err: false,
            warm: warm.is_some(),
            key_free: warm.is_some(),
            recycle: false,
            variant: 0,
            tried: Steps::default(),
            failed: Steps::default(),
            in_flight: None,
            cause: None,
            order: self.cfg.order,
            waiters: Waiters::default(),
            alloc_ticket: Some((ticket, now_us)),
            failed_mask: 0,
            failure: String::new(),
        };
        self.note(slot, State::Building, Why::Alloc, now_us);
        self.slots[slot as usize] = Slot::Busy(lease);
        self.free.remove(&slot);
        self.busy_end = self.busy_end.max(slot + 1);
        let u = self.usage.entry(who.tenant.to_string()).or_default();
        u.0 += 1;
        u.1 += bytes;
        self.counters.allocs_started += 1;
        self.advance(slot, now_us, host);
        None
    }

    /// The tenant's ALLOC rate (`tenant_allocs_per_s=`): a token bucket of one second's worth, refilled on the
    /// service's clock. Empty: BUSY, with the rate and the milliseconds until the next token.
    fn take_alloc_token(&mut self, tenant: &str, now_us: u64) -> Result<(), ErrorBody> {
        const ONE: u64 = 1_000_000;
        let rate = u64::from(self.cfg.tenant_allocs_per_s);
        if rate == 0 {
            return Ok(());
        }
        let full = rate * ONE;
        let bucket = self.alloc_rate.entry(tenant.to_string()).or_insert((full, now_us));
        // Tokens in millionths of an ALLOC: `rate` ALLOCs per 10^6 µs is `rate` millionths per µs.
        let elapsed = now_us.saturating_sub(bucket.1);
        bucket.0 = bucket.0.saturating_add(elapsed.saturating_mul(rate)).min(full);
        bucket.1 = now_us;
        if bucket.0 >= ONE {
            bucket.0 -= ONE;
            return Ok(());
        }
        let wait_ms = (ONE - bucket.0).div_ceil(rate).div_ceil(1000);
        Err(err(ErrorCode::Busy, &format!("ALLOC: tenant over its rate of {rate} per second; retry in {wait_ms} ms"))
            .with_detail([rate as u32, wait_ms as u32, 0]))
    }

    fn check_alloc(&self, a: &AllocReq) -> Result<(), ErrorBody> {
        if a.size == 0 {
            return Err(bad("alloc.size", "must be at least 1 byte"));
        }
        if a.size > self.cfg.max_lease() {
            return Err(bad(
                "alloc.size",
                &format!("must be at most {} bytes (the largest lease)", self.cfg.max_lease()),
            ));
        }
        if a.size > self.cfg.pool_bytes() {
            return Err(err(
                ErrorCode::NoMemory,
                &format!("{} bytes asked, the pool holds {}", a.size, self.cfg.pool_bytes()),
            ));
        }
        if a.access == 0 || a.access & !access::ALL != 0 {
            return Err(bad("alloc.access", "must be a non-empty set of REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC"));
        }
        if a.access & access::REMOTE_ATOMIC != 0
            && let Some(why) = self.hca.qp.atomics_refused()
        {
            return Err(bad("alloc.access", &format!("must not ask REMOTE_ATOMIC: {why}")));
        }
        if mtu_bytes(a.mtu).is_none() {
            return Err(bad("alloc.mtu", "must be an IB MTU code from 1 (256) to 5 (4096)"));
        }
        if a.client_qpn == 0 || a.client_qpn > 0xff_ffff {
            return Err(bad("alloc.client_qpn", "must be a 24-bit QPN other than 0"));
        }
        if a.client_psn > 0xff_ffff {
            return Err(bad("alloc.client_psn", "must be a 24-bit PSN"));
        }
        if a.client_gid == [0; 16] {
            return Err(bad("alloc.client_gid", "must be the client's GID"));
        }
        // The lease QPs send from the appliance's IPv4 RoCEv2 GID; firmware refuses a path whose remote GID is
        // of another type (INIT2RTR), so an IPv6 client cannot be reached.
        let g = a.client_gid;
        if g[..10] != [0; 10] || g[10..12] != [0xff, 0xff] {
            return Err(bad(
                "alloc.client_gid",
                "must be IPv4-mapped (::ffff:A.B.C.D): the appliance's RoCEv2 GID is IPv4",
            ));
        }
        if a.client_mac[0] & 1 != 0 {
            return Err(bad("alloc.client_mac", "must be a unicast MAC (the client's next hop), or 0 to resolve it"));
        }
        if a.ttl_ms > self.cfg.max_ttl_ms {
            return Err(bad("alloc.ttl_ms", &format!("must be at most {} ms", self.cfg.max_ttl_ms)));
        }
        Ok(())
    }

    /// ALLOC with `client_mac` 0: the MAC of the client GID's IPv4 address, as the host resolves it (ARP on
    /// the RDMA port, as the Linux RDMA core resolves a destination); the ALLOC proceeds once it is known,
    /// waits while the host asks (up to [`RESOLVE_TIMEOUT_MS`]), and fails when the host cannot resolve.
    fn resolve(&mut self, who: Who<'_>, a: &AllocReq, ticket: T, now_us: u64, host: &mut dyn Host) -> Option<Reply> {
        let g = a.client_gid;
        if g[..10] != [0; 10] || g[10..12] != [0xff, 0xff] {
            return Some(Err(bad("alloc.client_mac", "0 (resolve) needs an IPv4-mapped client_gid (::ffff:A.B.C.D)")));
        }
        let ip = core::net::Ipv4Addr::new(g[12], g[13], g[14], g[15]);
        match host.neighbour(ip) {
            Neighbour::Known(mac) => {
                let mut resolved = a.clone();
                resolved.client_mac = mac;
                self.counters.resolved += 1;
                self.alloc(who, &resolved, ticket, now_us, host)
            }
            Neighbour::Unsupported(why) => Some(Err(bad("alloc.client_mac", &format!("0 (resolve): {why}")))),
            Neighbour::Asking => {
                self.resolving.push(Parked {
                    tenant: who.tenant.to_string(),
                    session: who.session,
                    admin: who.admin,
                    req: a.clone(),
                    ticket,
                    ip,
                    deadline_us: now_us + RESOLVE_TIMEOUT_MS * 1000,
                });
                None
            }
        }
    }

    /// Timer scan: parked ALLOCs whose MAC is now known proceed; those past their deadline answer TIMEOUT.
    pub(super) fn poll_resolving(&mut self, now_us: u64, host: &mut dyn Host) {
        if self.resolving.is_empty() {
            return;
        }
        for p in core::mem::take(&mut self.resolving) {
            let reply = match host.neighbour(p.ip) {
                Neighbour::Asking if now_us < p.deadline_us => {
                    self.resolving.push(p);
                    continue;
                }
                Neighbour::Asking => {
                    self.counters.resolve_timeouts += 1;
                    Some(Err(err(
                        ErrorCode::Timeout,
                        &format!("client_mac 0 (resolve): no ARP answer for {} within {RESOLVE_TIMEOUT_MS} ms", p.ip),
                    )))
                }
                Neighbour::Known(_) | Neighbour::Unsupported(_) => {
                    let who = Who { session: p.session, tenant: &p.tenant, admin: p.admin };
                    self.resolve(who, &p.req, p.ticket, now_us, host)
                }
            };
            if let Some(r) = reply {
                self.answers.push((p.ticket, r));
            }
        }
    }

    /// A session ended: its ALLOCs still waiting for a MAC are dropped (nobody is left to answer).
    pub(super) fn drop_parked(&mut self, session: u64) {
        self.resolving.retain(|p| p.session != session);
    }

    fn tenant_usage(&self, tenant: &str) -> (u32, u64) {
        self.usage.get(tenant).copied().unwrap_or_default()
    }

    /// The fair share ([`crate::Config::tenants`]): `Some((share, reserved))` when `tenant` taking `bytes`
    /// more would go above its share and leave fewer unheld bytes than the other tenants' unused shares.
    fn over_share(&self, tenant: &str, bytes: u64) -> Option<(u64, u64)> {
        let tenants = u64::from(self.cfg.tenants);
        if self.cfg.tenant_bytes != u64::MAX || tenants < 2 {
            return None;
        }
        let total = self.cfg.pool_bytes();
        let share = total / tenants / self.cfg.extent * self.cfg.extent;
        let mine = self.tenant_usage(tenant).1;
        if mine.saturating_add(bytes) <= share {
            return None;
        }
        // The admin is no tenant: its leases count as held, not against a share.
        let others =
            self.usage.iter().filter(|(n, _)| n.as_str() != tenant && n.as_str() != leasebox_session::ADMIN_NAME);
        let (seen, unused) = others.fold((0u64, 0u64), |(k, u), (_, (_, b))| (k + 1, u + share.saturating_sub(*b)));
        let reserved = unused + tenants.saturating_sub(1 + seen) * share;
        let held: u64 = self.usage.values().map(|u| u.1).sum();
        let unheld = total.saturating_sub(held);
        (unheld.saturating_sub(bytes) < reserved).then_some((share, reserved))
    }

    /// A busy lease leaves the table (freed or fenced): its tenant's budget gets it back.
    pub(super) fn unbook(&mut self, tenant: &str, extents: usize) {
        let bytes = extents as u64 * self.cfg.extent;
        if let Some(u) = self.usage.get_mut(tenant) {
            u.0 = u.0.saturating_sub(1);
            u.1 = u.1.saturating_sub(bytes);
            if u.0 == 0 {
                self.usage.remove(tenant);
            }
        }
    }

    /// The build finished: the lease is Granted and ALLOC is answered.
    pub(super) fn granted(&mut self, slot: u32, now_us: u64) {
        let ready_by = now_us + self.cfg.ready_timeout_ms * 1000;
        let (gid, mac) = (self.hca.gid, self.hca.mac);
        self.note(slot, State::Granted, Why::Granted, now_us);
        let Some(l) = self.lease_mut(slot) else { return };
        l.phase = Phase::Granted { ready_by };
        let resp = AllocResp {
            lease: l.id,
            rkey: l.mkey.map_or(0, |k| k.0),
            remote_addr: l.extents[0],
            length: l.size,
            server_qpn: l.qpn.map_or(0, |q| q.0),
            server_psn: l.server_psn,
            server_gid: gid,
            mtu: l.mtu,
            ttl_ms: l.ttl_ms,
            server_mac: mac,
        };
        if let Some((ticket, since)) = l.alloc_ticket.take() {
            self.answers.push((ticket, Ok(Response::Alloc(resp))));
            self.counters.alloc_us.record(now_us.saturating_sub(since));
        }
        self.counters.allocs += 1;
    }
}
