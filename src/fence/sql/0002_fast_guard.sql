-- pgfence schema, version 2: a cheaper guard for the common case.
--
-- Applied by `pgfence init` after 0001 (src/fence/install.rs), in one transaction.
--
-- Version 1's guard ran every call with the installer's rights and its own search_path
-- (SECURITY DEFINER with SET search_path, a GUC save and restore per call) and, without a
-- lease, read the fence row twice: once to choose the lock mode, once under the lock. Most
-- calls need neither: they are read committed writes of an epoch that is already the
-- fence's current one. pgfence.guard now handles exactly those itself and hands everything
-- else to pgfence.guard_full, version 1's guard under a new name. It still runs with the
-- installer's rights (SECURITY DEFINER) but without a search_path of its own: every table,
-- function, operator and type in it is schema-qualified (or an SQL keyword such as bigint),
-- so the caller's search_path cannot change what it computes or run anything of the
-- caller's with the installer's rights.
--
-- Without a lease the fast path needs to know that the HWM already reached the epoch, so
-- that taking the lock shared is right (a bump needs it exclusive, and upgrading a shared
-- lock can deadlock). pgfence.guard_full records that in the session setting
-- pgfence.guard_passed ("<epoch> <fence>") when it lets a write of that epoch through;
-- the setting is transactional, so it never outlives a rolled-back bump. If the fast path
-- nevertheless finds the HWM below the epoch (a hand-set marker, a re-created fence row),
-- it falls through to the full guard, which is always right.

-- The full guard: version 1's pgfence.guard, unchanged but for its name and the marker it
-- leaves (below). It runs with the installer's rights and handles every case: the
-- first write of a new epoch, REPEATABLE READ and SERIALIZABLE, and every error.
--   p_fence       the fence's name
--   p_epoch       the session's declared epoch
--   p_lease_table the fence's lease table as configured (NULL: no lease)
--   p_keep_hwm    true in reject mode (check and raise the HWM); false in rewrite mode
--                 (only the lease checks: the rows carry the epochs)
-- Errors, in the contract's order: PF005, PF003, PF001. The checks are inline (not in
-- helper functions) so that an error's CONTEXT is one line.
CREATE FUNCTION pgfence.guard_full(p_fence text, p_epoch bigint, p_lease_table text,
                                   p_keep_hwm boolean)
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
                      HINT = 'pgfence init --database-url postgres://…/' || current_database()
                             || ' --config pgfence.toml registers the fence with its lease table and installs the trigger.';
        END IF;
        IF p_epoch > v_lease THEN
            RAISE EXCEPTION 'pgfence: epoch % is above the epoch the lease granted for fence "%" (current epoch %)',
                    p_epoch, p_fence,
                    v_lease || CASE WHEN v_lease = 0 THEN ': the lease row is missing or grants no epoch yet' ELSE '' END
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
            v_locked := pg_advisory_xact_lock(pgfence.lock_key(p_fence)) IS NULL OR true;
            SELECT f.hwm INTO v_hwm FROM pgfence.fence f WHERE f.name = p_fence FOR UPDATE;
        ELSE
            -- Same epoch: share the lock with the other writers of this epoch; a waiting
            -- bump queues ahead of later requests, so writers cannot starve it.
            v_locked := pg_advisory_xact_lock_shared(pgfence.lock_key(p_fence)) IS NULL OR true;
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
    END IF;
    -- The HWM is now at least p_epoch in this transaction. set_config is transactional: if
    -- the transaction (or the savepoint) rolls back, the marker goes with the bump.
    PERFORM set_config('pgfence.guard_passed', p_epoch::text || ' ' || p_fence, false);
END
$$;

-- The guard: runs in the client's transaction right before a fenced write. Same signature
-- and errors as version 1 (through pgfence.guard_full); passes without it when it can.
CREATE OR REPLACE FUNCTION pgfence.guard(p_fence text, p_epoch bigint, p_lease_table text DEFAULT NULL,
                                         p_keep_hwm boolean DEFAULT true)
    RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_hwm   bigint;
    v_lease bigint;
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
            SELECT f.hwm INTO v_hwm FROM pgfence.fence f WHERE f.name OPERATOR(pg_catalog.=) p_fence;
            IF p_epoch OPERATOR(pg_catalog.=) v_hwm THEN
                RETURN;
            END IF;
        END IF;
    END IF;
    -- Anything else (a new epoch, a stale one, an error to raise, another isolation level):
    -- the full guard decides, under the same lock if the fast path took it.
    PERFORM pgfence.guard_full(p_fence, p_epoch, p_lease_table, p_keep_hwm);
END
$$;

REVOKE ALL ON FUNCTION pgfence.guard_full(text, bigint, text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.guard_full(text, bigint, text, boolean) TO PUBLIC;
