-- pgfence schema, version 1.
--
-- Applied by `pgfence init` (src/fence/install.rs) inside one transaction, under an
-- advisory lock, after it created schema `pgfence` and table `pgfence.schema_version`.
-- Never edit a released migration: add 0002_....sql instead.
--
-- The locking design is explained in src/fence/mod.rs. In short: writers hold the
-- fence's advisory lock SHARED until they commit, a takeover (HWM bump or lease
-- epoch raise) takes it EXCLUSIVE, and heavyweight locks queue fairly.

CREATE TABLE pgfence.fence (
    -- The fence's name, as in pgfence.toml.
    name        text PRIMARY KEY,
    -- Durable high-water mark: the highest epoch that wrote or was granted. Never goes down.
    hwm         bigint NOT NULL DEFAULT 0 CHECK (hwm >= 0),
    -- The lease table, format('%I.%I', schema, table), set by `pgfence init --config`.
    -- Text, not regclass: pg_upgrade refuses reg* columns, and a dump must restore.
    lease_table text NULL,
    -- The lease row's `name`.
    lease_row   text NULL,
    -- The epoch the lease row grants (0: no row, nothing granted). Kept by the lease trigger.
    lease_epoch bigint NOT NULL DEFAULT 0 CHECK (lease_epoch >= 0),
    CONSTRAINT fence_lease_pair CHECK ((lease_table IS NULL) = (lease_row IS NULL)),
    CONSTRAINT fence_hwm_covers_lease CHECK (hwm >= lease_epoch)
);

COMMENT ON TABLE pgfence.fence IS
    'pgfence: one row per fence; hwm is the durable high-water mark of its epochs (never goes down)';

-- The advisory lock key of a fence (bigint key space; the installer uses the two-int space).
CREATE FUNCTION pgfence.lock_key(p_fence text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT pg_catalog.hashtextextended('pgfence:' OPERATOR(pg_catalog.||) p_fence, 0) $$;

-- Defence in depth: even the owner cannot lower a HWM or delete a fence by accident.
CREATE FUNCTION pgfence.fence_monotonic() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'pgfence: fence "%" cannot be deleted: its high-water mark (epoch %) must never go down',
                OLD.name, OLD.hwm
            USING ERRCODE = '23514',
                  HINT = 'To retire a fence on purpose, ALTER TABLE pgfence.fence DISABLE TRIGGER '
                         'pgfence_fence_monotonic, delete it, and enable the trigger again.';
    END IF;
    IF NEW.hwm < OLD.hwm OR NEW.name IS DISTINCT FROM OLD.name THEN
        RAISE EXCEPTION 'pgfence: the high-water mark of fence "%" cannot go from epoch % to % (or be renamed)',
                OLD.name, OLD.hwm, NEW.hwm
            USING ERRCODE = '23514';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER pgfence_fence_monotonic BEFORE UPDATE OR DELETE ON pgfence.fence
    FOR EACH ROW EXECUTE FUNCTION pgfence.fence_monotonic();

-- Raises a pgfence error. The proxy calls it for PF002/PF004 so that the rejection
-- travels through Postgres (pipelines, aborted transactions) and so that a database
-- without the schema answers 3F000/42883, which the proxy reports as PF005.
CREATE FUNCTION pgfence.reject(p_code text, p_message text, p_hint text DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
BEGIN
    IF p_hint IS NULL OR p_hint = '' THEN
        RAISE EXCEPTION USING ERRCODE = coalesce(p_code, 'PF004'), MESSAGE = coalesce(p_message, 'pgfence: rejected');
    END IF;
    RAISE EXCEPTION USING ERRCODE = coalesce(p_code, 'PF004'), MESSAGE = coalesce(p_message, 'pgfence: rejected'),
        HINT = p_hint;
END
$$;

-- The guard: runs in the client's transaction right before a fenced write.
--   p_fence       the fence's name
--   p_epoch       the session's declared epoch
--   p_lease_table the fence's lease table as configured (NULL: no lease)
--   p_keep_hwm    true in reject mode (check and raise the HWM); false in rewrite mode
--                 (only the lease checks: the rows carry the epochs)
-- Errors, in the contract's order: PF005, PF003, PF001. The checks are inline (not in
-- helper functions) so that an error's CONTEXT is one line.
CREATE FUNCTION pgfence.guard(p_fence text, p_epoch bigint, p_lease_table text DEFAULT NULL,
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
END
$$;

-- Applies a lease row (table p_table, row p_row) that now grants p_epoch to every fence
-- registered with it, and returns the epoch the row must carry: p_epoch lifted to the
-- fences' current epoch, so a new or re-created row is never born stale (NULL when no
-- fence uses the row: the caller leaves it alone). p_lowering:
-- the statement explicitly lowers the epoch; below a fence's current epoch that is an error.
CREATE FUNCTION pgfence.lease_grant(p_table text, p_row text, p_epoch bigint, p_lowering boolean)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
DECLARE
    v_epoch bigint := greatest(coalesce(p_epoch, 0), 0);
    v_any   boolean := false;
    v_f     record;
BEGIN
    FOR v_f IN SELECT f.name, greatest(f.hwm, f.lease_epoch) AS current
                 FROM pgfence.fence f WHERE f.lease_table = p_table AND f.lease_row = p_row LOOP
        IF p_lowering AND v_epoch < v_f.current THEN
            RAISE EXCEPTION 'pgfence: lease row "%" in % cannot go down to epoch %: fence "%" is at epoch % and epochs never go down',
                    p_row, p_table, v_epoch, v_f.name, v_f.current
                USING ERRCODE = 'PF001',
                      HINT = 'A lease epoch only goes up (epoch = epoch + 1 on takeover).';
        END IF;
        v_epoch := greatest(v_epoch, v_f.current);
        v_any := true;
    END LOOP;
    IF NOT v_any THEN
        RETURN NULL;  -- no fence uses this row: leave it alone
    END IF;
    -- Lock in name order so that two fences sharing a lease row cannot deadlock.
    FOR v_f IN SELECT f.name, f.hwm, f.lease_epoch
                 FROM pgfence.fence f WHERE f.lease_table = p_table AND f.lease_row = p_row ORDER BY f.name LOOP
        IF v_epoch > v_f.hwm THEN
            -- A takeover: wait for every transaction past the guard, so that once this
            -- commits, no older epoch commits a fenced write.
            PERFORM pg_advisory_xact_lock(pgfence.lock_key(v_f.name));
            UPDATE pgfence.fence SET lease_epoch = v_epoch, hwm = greatest(hwm, v_epoch) WHERE name = v_f.name;
        ELSIF v_f.lease_epoch IS DISTINCT FROM v_epoch THEN
            UPDATE pgfence.fence SET lease_epoch = v_epoch WHERE name = v_f.name;
        END IF;
    END LOOP;
    RETURN v_epoch;
END
$$;

-- A lease row that grants nothing any more (deleted, renamed away, truncated).
CREATE FUNCTION pgfence.lease_revoke(p_table text, p_row text) RETURNS void
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
    UPDATE pgfence.fence SET lease_epoch = 0
     WHERE lease_table = p_table AND (p_row IS NULL OR lease_row = p_row) AND lease_epoch <> 0
$$;

-- BEFORE INSERT OR UPDATE OR DELETE FOR EACH ROW on a lease table (trigger pgfence_lease).
CREATE FUNCTION pgfence.lease_trigger() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
DECLARE
    v_table text;
    v_epoch bigint;
BEGIN
    -- A renewal (same row, same epoch) must do nothing that can block or be blocked.
    IF TG_OP = 'UPDATE' AND NEW.name IS NOT DISTINCT FROM OLD.name AND NEW.epoch IS NOT DISTINCT FROM OLD.epoch THEN
        RETURN NEW;
    END IF;
    v_table := format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME);
    IF TG_OP = 'DELETE' THEN
        PERFORM pgfence.lease_revoke(v_table, OLD.name);
        RETURN OLD;
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.name IS DISTINCT FROM OLD.name THEN
        -- A rename: the old name's fences lose their grant, the new name's gain one.
        PERFORM pgfence.lease_revoke(v_table, OLD.name);
        v_epoch := pgfence.lease_grant(v_table, NEW.name, NEW.epoch, false);
    ELSE
        v_epoch := pgfence.lease_grant(v_table, NEW.name, NEW.epoch,
                                       TG_OP = 'UPDATE' AND NEW.epoch < OLD.epoch);
    END IF;
    IF v_epoch IS NOT NULL AND v_epoch IS DISTINCT FROM NEW.epoch THEN
        NEW.epoch := v_epoch;
    END IF;
    RETURN NEW;
END
$$;

-- BEFORE TRUNCATE FOR EACH STATEMENT on a lease table (trigger pgfence_lease_truncate).
CREATE FUNCTION pgfence.lease_truncate_trigger() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
BEGIN
    PERFORM pgfence.lease_revoke(format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME), NULL);
    RETURN NULL;
END
$$;

-- Privileges: applications need USAGE and EXECUTE on guard/reject only; the guard and
-- the lease triggers run with the installer's rights. Reading the fences is harmless.
REVOKE ALL ON SCHEMA pgfence FROM PUBLIC;
GRANT USAGE ON SCHEMA pgfence TO PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM PUBLIC;
GRANT SELECT ON pgfence.fence, pgfence.schema_version TO PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgfence FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.guard(text, bigint, text, boolean) TO PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.reject(text, text, text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.lock_key(text) TO PUBLIC;
