-- pgfence schema, version 8: a fence registered with a lease is checked against it, whoever
-- calls the guard.
--
-- Applied by `pgfence init` after 0007 (src/fence/install.rs), in one transaction.
--
-- The guard is callable by every role (the proxy's sessions run it as the application's role),
-- and it runs with the installer's rights. Which lease a fence has was the caller's argument:
-- called with none, the guard of a fence that `pgfence init --config` registered with a lease
-- took the lease-less path, where the first write of a new epoch raises the HWM. Any role able
-- to connect could so lift a leased fence's HWM above the epoch the lease granted, even to the
-- largest bigint, after which the lease's takeover (epoch + 1) can never succeed again. Now the
-- registered lease table stands in for a missing argument: the guard then only checks the epoch
-- against the lease and never raises the HWM, as with the argument. pgfence.guard's inline
-- steady state needs no change: it passes only an epoch equal to the HWM and changes nothing.
--
-- Version 6's pgfence.guard_full, with that one rule added at its start.

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

    IF p_lease_table IS NULL THEN
        -- The fence's registered lease applies whoever calls: a caller that names no lease
        -- (any role may call the guard) must not take the lease-less path, where a new
        -- epoch raises the HWM, past what the lease granted.
        SELECT f.lease_table INTO p_lease_table FROM pgfence.fence f WHERE f.name = p_fence;
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
        PERFORM pgfence.count_change();
    END IF;
END
$$;

COMMENT ON FUNCTION pgfence.guard_full(text, bigint, text, boolean) IS
    'pgfence: the full fencing check; a fence registered with a lease is checked against it';
