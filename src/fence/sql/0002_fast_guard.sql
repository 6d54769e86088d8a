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
-- lock can deadlock). When pgfence.guard_full lets a write of an epoch through, the HWM is
-- at least that epoch in this transaction, and pgfence.guard records it in the session
-- setting pgfence.guard_passed ("<epoch> <fence>"); the setting is transactional, so it
-- never outlives a rolled-back bump. If the fast path nevertheless finds the HWM below the
-- epoch (a hand-set marker, a re-created fence row), it falls through to the full guard,
-- which is always right.

-- Version 1's guard becomes the full guard, unchanged: it runs with the installer's rights
-- and its own search_path and handles every case - the first write of a new epoch,
-- REPEATABLE READ and SERIALIZABLE, and every error. Its grant moves with it.
ALTER FUNCTION pgfence.guard(text, bigint, text, boolean) RENAME TO guard_full;

-- The guard: runs in the client's transaction right before a fenced write. Same signature
-- and errors as version 1 (through pgfence.guard_full); passes without it when it can.
CREATE FUNCTION pgfence.guard(p_fence text, p_epoch bigint, p_lease_table text DEFAULT NULL,
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
    IF p_keep_hwm AND p_lease_table IS NULL THEN
        -- It let the write through: the HWM is now at least p_epoch in this transaction.
        PERFORM pg_catalog.set_config('pgfence.guard_passed',
                                      p_epoch::pg_catalog.text OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) p_fence,
                                      false);
    END IF;
END
$$;

REVOKE ALL ON FUNCTION pgfence.guard(text, bigint, text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.guard(text, bigint, text, boolean) TO PUBLIC;
