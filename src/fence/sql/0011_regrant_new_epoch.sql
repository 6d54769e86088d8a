-- pgfence schema, version 11: a lease row that grants a fence again after a revocation starts
-- a new epoch, and the lease trigger decides under the fence's lock.
--
-- Applied by `pgfence init` after 0010 (src/fence/install.rs), in one transaction.
--
-- Until this version pgfence.lease_grant lifted a lease row that would start below the
-- fence's current epoch (max of HWM and lease epoch) to that epoch, and no further. After a
-- revocation (the row deleted, renamed away, or the table truncated: lease_epoch 0, the HWM
-- kept) that is the last leader's epoch: a row created again with the table's default epoch,
-- or with the old epoch itself, granted the old leader's epoch again, so the leader that had
-- been cut off wrote again beside the new holder, both declaring the same epoch. It also read
-- the fence rows before it took the fence's lock, so a revocation that committed meanwhile
-- could be undone by the grant that raced it, and an INSERT ... ON CONFLICT that met the live
-- row (the row trigger fires for the insert attempt before the conflict is found) could
-- raise the fence to an epoch no row granted.
--
-- Now:
-- * pgfence.lease_grant takes the lock of every fence of the row exclusive (in name order)
--   before it reads them, and a row that is new under its name (inserted, renamed onto it),
--   or that grants a fence with no live grant (lease_epoch 0), starts strictly above the
--   fence's current epoch once that is 1 or more: at current + 1 if it asked for less. That
--   is a takeover, and it waits for the transactions past the guard, as one does. A row of a
--   fence with a live grant keeps the old rule (lifted to the current epoch; lowering it
--   fails).
-- * pgfence.lease_insert decides for an INSERT: if the row exists, the insert meets it (a
--   unique violation, or ON CONFLICT) and changes nothing, not even the epoch the conflict
--   clause sees as EXCLUDED; the fence is left alone. It reads the row FOR KEY SHARE, which
--   waits for a DELETE or rename of it in progress and keeps it from going before the insert
--   meets it (Postgres does not fire the trigger again when the conflict it waited for goes
--   away). If the row does not exist it waits for any other insert or rename of it (an
--   advisory lock of the row's, pgfence.lease_row_appears), looks again, and grants under
--   the fence locks.
--
-- Unchanged: a renewal (same row, same epoch) takes no lock; a row no fence uses is left
-- alone; DELETE, TRUNCATE and renaming away revoke.

DROP FUNCTION pgfence.lease_grant(text, text, bigint, boolean);

-- Applies a lease row (table p_table, row p_row) that now grants p_epoch to every fence
-- registered with it; returns the epoch the row must carry, NULL when no fence uses the row.
-- p_lowering: the statement explicitly lowers the epoch (below the current one: an error).
-- p_new_row: the row is new under this name (inserted, or renamed onto it).
CREATE FUNCTION pgfence.lease_grant(p_table text, p_row text, p_epoch bigint, p_lowering boolean,
                                    p_new_row boolean)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
DECLARE
    v_epoch bigint := greatest(coalesce(p_epoch, 0), 0);
    v_any   boolean := false;
    v_f     record;
BEGIN
    -- Lock first, in name order (two grants of a shared row cannot deadlock), then read: in
    -- read committed each statement below sees every lease change the locks waited for.
    FOR v_f IN SELECT f.name FROM pgfence.fence f
                WHERE f.lease_table = p_table AND f.lease_row = p_row ORDER BY f.name LOOP
        PERFORM pg_advisory_xact_lock(pgfence.lock_key(v_f.name));
    END LOOP;
    FOR v_f IN SELECT f.name, f.hwm, f.lease_epoch, greatest(f.hwm, f.lease_epoch) AS current
                 FROM pgfence.fence f WHERE f.lease_table = p_table AND f.lease_row = p_row LOOP
        IF p_lowering AND v_epoch < v_f.current THEN
            RAISE EXCEPTION 'pgfence: lease row "%" in % cannot go down to epoch %: fence "%" is at epoch % and epochs never go down',
                    p_row, p_table, v_epoch, v_f.name, v_f.current
                USING ERRCODE = 'PF001',
                      HINT = 'A lease epoch only goes up (epoch = epoch + 1 on takeover).';
        END IF;
        IF (p_new_row OR v_f.lease_epoch = 0) AND v_f.current >= 1 THEN
            -- A grant after a revocation, or by a row that replaces the one that granted:
            -- the epochs up to the current one belong to leaders that were cut off.
            IF v_f.current = 9223372036854775807 THEN
                RAISE EXCEPTION 'pgfence: lease row "%" in % cannot grant fence "%" a new epoch: the fence is at the largest epoch, %',
                        p_row, p_table, v_f.name, v_f.current
                    USING ERRCODE = 'PF003',
                          HINT = 'A new grant needs an epoch above the fence''s current epoch; epochs are bigint.';
            END IF;
            v_epoch := greatest(v_epoch, v_f.current + 1);
        ELSE
            v_epoch := greatest(v_epoch, v_f.current);
        END IF;
        v_any := true;
    END LOOP;
    IF NOT v_any THEN
        RETURN NULL;  -- no fence uses this row: leave it alone
    END IF;
    FOR v_f IN SELECT f.name, f.hwm, f.lease_epoch
                 FROM pgfence.fence f WHERE f.lease_table = p_table AND f.lease_row = p_row ORDER BY f.name LOOP
        -- Held already, unless the fence was registered with the row since: then taken now,
        -- before the row.
        PERFORM pg_advisory_xact_lock(pgfence.lock_key(v_f.name));
        IF v_epoch > v_f.hwm THEN
            -- A takeover: the lock waited for every transaction past the guard, so once this
            -- commits, no older epoch commits a fenced write.
            UPDATE pgfence.fence SET lease_epoch = v_epoch, hwm = greatest(hwm, v_epoch) WHERE name = v_f.name;
            -- Counted here too (the trigger counts it as well): a lease trigger enabled ALWAYS
            -- fires where the fence row's triggers do not (session_replication_role = replica).
            PERFORM pgfence.count_change();
        ELSIF v_f.lease_epoch IS DISTINCT FROM v_epoch THEN
            UPDATE pgfence.fence SET lease_epoch = v_epoch WHERE name = v_f.name;
            PERFORM pgfence.count_change();
        END IF;
    END LOOP;
    RETURN v_epoch;
END
$$;
REVOKE ALL ON FUNCTION pgfence.lease_grant(text, text, bigint, boolean, boolean) FROM PUBLIC;

-- Serialises the ways row p_row of lease table p_table comes to be (an insert, a rename onto
-- it), to the end of the transaction: a two-int advisory key, apart from the fences' bigint
-- keys (the first int is the one of init's lock).
CREATE FUNCTION pgfence.lease_row_appears(p_table text, p_row text) RETURNS void
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
    SELECT pg_advisory_xact_lock(1885824613, hashtext('pgfence lease row:' || p_table || ' ' || p_row))
$$;
REVOKE ALL ON FUNCTION pgfence.lease_row_appears(text, text) FROM PUBLIC;

-- The grant of an INSERT of row p_row into lease table p_table asking for p_epoch: the epoch
-- the row must carry, NULL to leave it as it is (no fence uses the row, or the insert meets
-- the row that exists and so changes nothing).
CREATE FUNCTION pgfence.lease_insert(p_table text, p_row text, p_epoch bigint)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
DECLARE
    v_exists boolean;
    v_look   text := format('SELECT true FROM %s WHERE name = $1 FOR KEY SHARE', p_table);
BEGIN
    IF NOT EXISTS (SELECT FROM pgfence.fence f WHERE f.lease_table = p_table AND f.lease_row = p_row) THEN
        RETURN NULL;
    END IF;
    -- FOR KEY SHARE waits for a DELETE or rename of the row in progress (a revocation), and
    -- keeps the row from going until this transaction ends: the insert then meets it. It
    -- does not wait for a takeover or a renewal, nor they for it. Under REPEATABLE READ a row
    -- gone since the snapshot is a serialization failure.
    EXECUTE v_look INTO v_exists USING p_row;
    IF v_exists THEN
        RETURN NULL;
    END IF;
    -- A new row: once no other insert or rename of it is in progress, look once more (one
    -- may have committed meanwhile), then grant. Not under the fences' locks: an insert that
    -- then meets the row and waits for it in DO UPDATE must not hold them, or a takeover
    -- holding the row and waiting for them would deadlock with it.
    PERFORM pgfence.lease_row_appears(p_table, p_row);
    EXECUTE v_look INTO v_exists USING p_row;
    IF v_exists THEN
        RETURN NULL;
    END IF;
    RETURN pgfence.lease_grant(p_table, p_row, p_epoch, false, true);
END
$$;
REVOKE ALL ON FUNCTION pgfence.lease_insert(text, text, bigint) FROM PUBLIC;

-- Version 1's trigger, with inserts decided by pgfence.lease_insert and a row renamed onto a
-- fence's row granting as a new row.
CREATE OR REPLACE FUNCTION pgfence.lease_trigger() RETURNS trigger
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
    IF TG_OP = 'INSERT' THEN
        v_epoch := pgfence.lease_insert(v_table, NEW.name, NEW.epoch);
    ELSIF NEW.name IS DISTINCT FROM OLD.name THEN
        -- A rename: the old name's fences lose their grant, the new name's gain one.
        PERFORM pgfence.lease_revoke(v_table, OLD.name);
        PERFORM pgfence.lease_row_appears(v_table, NEW.name);
        v_epoch := pgfence.lease_grant(v_table, NEW.name, NEW.epoch, false, true);
    ELSE
        v_epoch := pgfence.lease_grant(v_table, NEW.name, NEW.epoch, NEW.epoch < OLD.epoch, false);
    END IF;
    IF v_epoch IS NOT NULL AND v_epoch IS DISTINCT FROM NEW.epoch THEN
        NEW.epoch := v_epoch;
    END IF;
    RETURN NEW;
END
$$;
