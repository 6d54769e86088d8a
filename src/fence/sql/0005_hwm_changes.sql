-- pgfence schema, version 5: the short path stops re-reading a fence row nobody changed.
--
-- Applied by `pgfence init` after 0004 (src/fence/install.rs), in one transaction.
--
-- Version 2's short path (no lease, read committed, an epoch the HWM has reached) took the
-- fence's lock shared and read the fence row to see that the HWM still was the epoch. That
-- read is a query of its own inside the guard, about half of what the short path costs.
-- Most of the time nothing changed since the session last read the row, and that can be
-- known without reading it:
--
-- * pgfence.hwm_changes counts every change to a fence's HWM (and every row inserted or
--   deleted, and TRUNCATE): the trigger pgfence_fence_changed takes the changed fence's lock
--   EXCLUSIVE and then draws a number from the sequence, in the changing transaction, before
--   it commits. Sequences are not transactional, so the count is seen at once, by every
--   session, without a snapshot; a rolled-back change leaves it raised, which only costs a
--   read.
-- * When the short path has read HWM = epoch under the shared lock, it records the count it
--   read (before the row, after the lock) in the transactional session setting
--   pgfence.guard_checked. Later, holding the shared lock again, it reads the count: if it is
--   still the recorded one, no change to any fence row began since the row was read (a
--   change takes the lock exclusive before it counts, and cannot hold it while this
--   transaction holds it shared; one that counted before the row was read had committed
--   before the lock was granted, so the read saw it). The HWM is still the epoch, and the
--   guard returns without reading the row.
-- * The count goes with pgfence.guard_passed ("<epoch> <fence>"): every time the full guard
--   lets a write through and sets that marker, the count is cleared, so a recorded count
--   always speaks of the epoch and fence in the marker beside it.
-- * Only a committed HWM is recorded. A transaction that changed a fence row itself sees its
--   own change before it commits, and may still lose it without any count (ROLLBACK PREPARED
--   after PREPARE TRANSACTION, which keeps the session's settings as a commit would). Every
--   such change holds the fence's lock exclusive until its transaction ends (a savepoint
--   rolled back releases both), so no count is recorded by a transaction that holds it
--   (pg_locks; only on the read path, after a change). A setting would not do: RESET ALL
--   clears settings inside a transaction, and it cannot release a lock.
--
-- Like pgfence.guard_passed, the setting is the session's own: a session that sets both by
-- hand can skip the read, which is the case of a client that wants to write (fencing is not
-- access control; docs/FENCING.md). A change made with the triggers disabled (superuser,
-- session_replication_role = replica) is not counted: the full guard's own bump counts
-- explicitly for that reason. The sequence is pgfence's: with a CACHE above 1 a backend's
-- numbers do not reach the others, and a RESTART repeats them; it must stay as made here.
--
-- A hand-made change of a fence row locks the row before the trigger waits for the fence's
-- lock, where a takeover takes the lock first and then the row: racing one, it may end in
-- a deadlock that Postgres breaks by failing one of them (40P01, retry).

CREATE SEQUENCE pgfence.hwm_changes AS bigint NO CYCLE;
COMMENT ON SEQUENCE pgfence.hwm_changes IS
    'pgfence: counts changes to pgfence.fence; the guard''s short path re-reads a fence row only after it moved';
REVOKE ALL ON SEQUENCE pgfence.hwm_changes FROM PUBLIC;
SELECT pg_catalog.setval('pgfence.hwm_changes', 1, true);

-- AFTER each change of a fence row's HWM or name, INSERT, DELETE (FOR EACH ROW) and TRUNCATE
-- (FOR EACH STATEMENT): lock, then count.
CREATE FUNCTION pgfence.fence_changed() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
BEGIN
    IF TG_LEVEL = 'ROW' THEN
        -- Wait for every transaction past the guard of the fences this row was and is.
        IF TG_OP IN ('UPDATE', 'DELETE') THEN
            PERFORM pg_advisory_xact_lock(pgfence.lock_key(OLD.name));
        END IF;
        IF TG_OP IN ('UPDATE', 'INSERT') THEN
            PERFORM pg_advisory_xact_lock(pgfence.lock_key(NEW.name));
        END IF;
    END IF;
    -- TRUNCATE takes no fence lock: a fence without a row has HWM 0, and a write passing at
    -- the old HWM meanwhile is above that.
    PERFORM nextval('pgfence.hwm_changes');
    RETURN NULL;
END
$$;

CREATE TRIGGER pgfence_fence_changed AFTER INSERT OR DELETE ON pgfence.fence
    FOR EACH ROW EXECUTE FUNCTION pgfence.fence_changed();
CREATE TRIGGER pgfence_fence_changed_hwm AFTER UPDATE ON pgfence.fence
    FOR EACH ROW WHEN (OLD.hwm IS DISTINCT FROM NEW.hwm OR OLD.name IS DISTINCT FROM NEW.name)
    EXECUTE FUNCTION pgfence.fence_changed();
CREATE TRIGGER pgfence_fence_truncated AFTER TRUNCATE ON pgfence.fence
    FOR EACH STATEMENT EXECUTE FUNCTION pgfence.fence_changed();

-- The full guard, version 4's with one addition: its bump counts itself, so that it is
-- counted even where triggers do not fire.
CREATE OR REPLACE FUNCTION pgfence.guard_full(p_fence text, p_epoch bigint, p_lease_table text DEFAULT NULL,
                                   p_keep_hwm boolean DEFAULT true)
    RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
DECLARE
    v_hwm     bigint;
    v_lease   bigint;
    v_reg     text;
    v_trigger boolean;
    v_locked  boolean := false;
    v_rc      boolean := current_setting('transaction_isolation') = 'read committed';
BEGIN
    IF p_fence IS NULL OR p_epoch IS NULL OR p_epoch < 1 THEN
        RAISE EXCEPTION 'pgfence: epoch % is not valid for fence "%": epochs are integers from 1 to 9223372036854775807',
                coalesce(p_epoch::text, 'NULL'), p_fence
            USING ERRCODE = 'PF003', HINT = 'SET pgfence.epoch to the epoch your lease acquisition returned.';
    END IF;

    IF p_lease_table IS NOT NULL THEN
        -- With a lease the guard never raises the HWM (the lease trigger does, and a granted
        -- epoch is never above it), so it takes the shared lock straight away and reads once.
        -- Lock calls are plain assignments: plpgsql evaluates those without a query.
        v_locked := pg_advisory_xact_lock_shared(pgfence.lock_key(p_fence)) IS NULL;
        IF v_rc THEN
            SELECT f.hwm, f.lease_epoch, f.lease_table INTO v_hwm, v_lease, v_reg
              FROM pgfence.fence f WHERE f.name = p_fence;
        ELSE
            -- The transaction's snapshot may predate a committed takeover: FOR SHARE turns
            -- that into 40001 instead of a stale pass.
            SELECT f.hwm, f.lease_epoch, f.lease_table INTO v_hwm, v_lease, v_reg
              FROM pgfence.fence f WHERE f.name = p_fence FOR SHARE;
        END IF;
        v_trigger := EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                              WHERE t.tgrelid = to_regclass(p_lease_table) AND t.tgname = 'pgfence_lease'
                                AND t.tgfoid = 'pgfence.lease_trigger()'::regprocedure
                                AND t.tgenabled IN ('O', 'A'));
        -- PF005 unless `pgfence init --config` registered this lease table and its trigger is in place.
        IF v_reg IS NULL OR NOT v_trigger OR NOT (v_reg = p_lease_table OR to_regclass(v_reg) = to_regclass(p_lease_table)) THEN
            RAISE EXCEPTION 'pgfence: lease trigger for fence "%" on table % is missing: run pgfence init --config in database "%"',
                    p_fence, p_lease_table, current_database()
                USING ERRCODE = 'PF005',
                      HINT = 'pgfence init --database-url postgres://.../' || current_database()
                             || ' --config pgfence.toml registers the fence with its lease table and installs the trigger.';
        END IF;
        IF p_epoch > v_lease THEN
            RAISE EXCEPTION 'pgfence: epoch % is above the epoch the lease granted for fence "%" (current epoch %)',
                    p_epoch, p_fence,
                    greatest(v_hwm, v_lease)
                    || CASE WHEN v_lease = 0 THEN '; the lease grants no epoch: its row is missing or its epoch is 0' ELSE '' END
                USING ERRCODE = 'PF003',
                      HINT = 'Acquire the lease and declare the epoch the acquisition returned; '
                             'an epoch the lease did not grant cannot write.';
        END IF;
        IF p_keep_hwm AND p_epoch < greatest(v_hwm, v_lease) THEN
            RAISE EXCEPTION 'pgfence: epoch % is stale for fence "%" (current epoch %)',
                    p_epoch, p_fence, greatest(v_hwm, v_lease)
                USING ERRCODE = 'PF001',
                      HINT = 'Another leader took over; stop writing and re-acquire the lease.';
        END IF;
        RETURN;
    END IF;

    IF NOT p_keep_hwm THEN
        RETURN;  -- rewrite mode without a lease: the rows carry the epochs
    END IF;

    -- Without a lease the first write of a new epoch raises the HWM. A plain read first: it
    -- fails fast and chooses the lock mode (no shared -> exclusive upgrade, which could deadlock
    -- two writers of the new epoch).
    SELECT f.hwm INTO v_hwm FROM pgfence.fence f WHERE f.name = p_fence;
    IF NOT FOUND THEN
        INSERT INTO pgfence.fence (name) VALUES (p_fence) ON CONFLICT (name) DO NOTHING;
        v_hwm := 0;
    END IF;

    -- Twice: on the plain read (fail fast, without waiting), then on the value read under the lock.
    LOOP
        IF p_epoch < v_hwm THEN
            RAISE EXCEPTION 'pgfence: epoch % is stale for fence "%" (current epoch %)', p_epoch, p_fence, v_hwm
                USING ERRCODE = 'PF001',
                      HINT = 'Another leader took over; stop writing and re-acquire the lease.';
        END IF;
        EXIT WHEN v_locked;
        IF p_epoch > v_hwm THEN
            -- Bump: wait for every transaction already past the guard, then re-read.
            PERFORM pg_advisory_xact_lock(pgfence.lock_key(p_fence));
            v_locked := true;
            SELECT f.hwm INTO v_hwm FROM pgfence.fence f WHERE f.name = p_fence FOR UPDATE;
        ELSE
            -- Same epoch: share the lock with the other writers of this epoch; a waiting
            -- bump queues ahead of later requests, so writers cannot starve it.
            PERFORM pg_advisory_xact_lock_shared(pgfence.lock_key(p_fence));
            v_locked := true;
            IF v_rc THEN
                -- A new snapshot: sees any bump we waited behind.
                SELECT f.hwm INTO v_hwm FROM pgfence.fence f WHERE f.name = p_fence;
            ELSE
                SELECT f.hwm INTO v_hwm FROM pgfence.fence f WHERE f.name = p_fence FOR SHARE;
            END IF;
        END IF;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'pgfence: fence "%" disappeared from pgfence.fence during the guard', p_fence
                USING ERRCODE = 'PF005', HINT = 'Run pgfence init again.';
        END IF;
    END LOOP;

    IF p_epoch > v_hwm THEN
        -- Only on the bump path: a HWM never goes down, so the shared path re-reads a HWM
        -- at least as high as the one that chose it.
        UPDATE pgfence.fence SET hwm = p_epoch WHERE name = p_fence;
        -- Counted here too (the trigger counts it as well): a bump must be counted even in a
        -- session whose triggers do not fire.
        PERFORM nextval('pgfence.hwm_changes');
    END IF;
END
$$;

-- The guard: version 2's short path, now trusting a recorded count instead of re-reading
-- the fence row when it can. Same signature, errors and grants.
CREATE OR REPLACE FUNCTION pgfence.guard(p_fence text, p_epoch bigint, p_lease_table text DEFAULT NULL,
                              p_keep_hwm boolean DEFAULT true)
    RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_hwm   bigint;
    v_lease bigint;
    v_count bigint;
    v_key   bigint;
    v_ok    boolean;
BEGIN
    IF p_fence IS NOT NULL AND p_epoch OPERATOR(pg_catalog.>=) 1
       AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        IF p_lease_table IS NOT NULL THEN
            -- Lock, then read: in read committed the SELECT's snapshot follows the lock, so it
            -- sees any takeover the lock waited for.
            v_ok := pg_catalog.pg_advisory_xact_lock_shared(pgfence.lock_key(p_fence)) IS NULL;
            SELECT f.hwm, f.lease_epoch,
                   f.lease_table OPERATOR(pg_catalog.=) p_lease_table AND EXISTS (
                       SELECT FROM pg_catalog.pg_trigger t
                        WHERE t.tgrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(p_lease_table)
                          AND t.tgname OPERATOR(pg_catalog.=) 'pgfence_lease'
                          AND t.tgfoid OPERATOR(pg_catalog.=) 'pgfence.lease_trigger()'::pg_catalog.regprocedure
                          AND t.tgenabled OPERATOR(pg_catalog.=) ANY ('{O,A}'::pg_catalog."char"[]))
              INTO v_hwm, v_lease, v_ok
              FROM pgfence.fence f WHERE f.name OPERATOR(pg_catalog.=) p_fence;
            IF v_ok AND p_epoch OPERATOR(pg_catalog.<=) v_lease
               AND (NOT p_keep_hwm OR p_epoch OPERATOR(pg_catalog.>=) GREATEST(v_hwm, v_lease)) THEN
                RETURN;
            END IF;
        ELSIF NOT p_keep_hwm THEN
            RETURN;  -- rewrite mode without a lease: the rows carry the epochs
        ELSIF pg_catalog.current_setting('pgfence.guard_passed', true) OPERATOR(pg_catalog.=)
                  (p_epoch::pg_catalog.text OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) p_fence) THEN
            v_ok := pg_catalog.pg_advisory_xact_lock_shared(pgfence.lock_key(p_fence)) IS NULL;
            -- After the lock, before the row: the count the row's value is known at.
            v_count := pg_catalog.pg_sequence_last_value('pgfence.hwm_changes'::pg_catalog.regclass);
            IF pg_catalog.current_setting('pgfence.guard_checked', true) OPERATOR(pg_catalog.=)
                   v_count::pg_catalog.text THEN
                RETURN;  -- no fence row changed since this session read HWM = epoch
            END IF;
            SELECT f.hwm INTO v_hwm FROM pgfence.fence f WHERE f.name OPERATOR(pg_catalog.=) p_fence;
            IF p_epoch OPERATOR(pg_catalog.=) v_hwm THEN
                -- Not a HWM this transaction wrote itself (it may never commit): a writer of
                -- the fence row holds the fence's lock exclusive to its end.
                v_key := pgfence.lock_key(p_fence);
                IF v_count IS NOT NULL AND NOT EXISTS (
                       SELECT FROM pg_catalog.pg_locks l
                        WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
                          AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
                          AND l.mode OPERATOR(pg_catalog.=) 'ExclusiveLock'
                          AND l.objsubid OPERATOR(pg_catalog.=) 1
                          AND l.classid OPERATOR(pg_catalog.=)
                              ((v_key OPERATOR(pg_catalog.>>) 32) OPERATOR(pg_catalog.&) 4294967295)::pg_catalog.oid
                          AND l.objid OPERATOR(pg_catalog.=)
                              (v_key OPERATOR(pg_catalog.&) 4294967295)::pg_catalog.oid) THEN
                    PERFORM pg_catalog.set_config('pgfence.guard_checked', v_count::pg_catalog.text, false);
                END IF;
                RETURN;
            END IF;
        END IF;
    END IF;
    -- Anything else (a new epoch, a stale one, an error to raise, another isolation level):
    -- the full guard decides, under the same lock if the short path took it.
    PERFORM pgfence.guard_full(p_fence, p_epoch, p_lease_table, p_keep_hwm);
    IF p_keep_hwm AND p_lease_table IS NULL THEN
        -- It let the write through: the HWM is now at least p_epoch in this transaction. The
        -- recorded count spoke of the marker before; it is cleared with it.
        PERFORM pg_catalog.set_config('pgfence.guard_passed',
                                      p_epoch::pg_catalog.text OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) p_fence,
                                      false);
        PERFORM pg_catalog.set_config('pgfence.guard_checked', '', false);
    END IF;
END
$$;
