use proptest::prelude::*;

use super::*;

/// public.invoices (fence 0), billing.ledger (fence 1), public."Mixed" (fence 2).
fn fences() -> FenceSet {
    FenceSet::new(vec![
        (TableName::parse_config("invoices").unwrap(), FenceId(0)),
        (TableName::parse_config("billing.ledger").unwrap(), FenceId(1)),
        (TableName::parse_config("\"Mixed\"").unwrap(), FenceId(2)),
    ])
}

/// A compact rendering so that the table below stays readable.
fn render(k: &StmtKind) -> String {
    match k {
        StmtKind::Other => "other".into(),
        StmtKind::Write { tables, .. } => {
            format!(
                "write:{}",
                tables.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(",")
            )
        }
        StmtKind::Unanalysable { fences } => {
            format!(
                "pf004:{}",
                fences.iter().map(|f| f.0.to_string()).collect::<Vec<_>>().join(",")
            )
        }
        StmtKind::Declare(_) => "declare".into(),
        StmtKind::Prepare { name, inner } => format!("prepare {name}:{}", render(inner)),
        StmtKind::Execute { name } => format!("execute {name}"),
        StmtKind::Deallocate { name: Some(n) } => format!("deallocate {n}"),
        StmtKind::Deallocate { name: None } => "deallocate all".into(),
        StmtKind::Close { portal: Some(p) } => format!("close {p}"),
        StmtKind::Close { portal: None } => "close-all".into(),
        StmtKind::Fetch { portals } => format!(
            "fetch {}",
            portals
                .iter()
                .map(|p| p.as_deref().unwrap_or("?"))
                .collect::<Vec<_>>()
                .join(",")
        ),
        StmtKind::Savepoint(op) => format!("{op:?}"),
        StmtKind::EndTransaction {
            commit: true, chain, ..
        } => format!("end:commit{}", chain_suffix(*chain)),
        StmtKind::EndTransaction {
            commit: false, chain, ..
        } => format!("end:rollback{}", chain_suffix(*chain)),
    }
}

fn chain_suffix(chain: bool) -> &'static str {
    if chain { "+chain" } else { "" }
}

/// A text whose statement boundaries rest on the routine-body rule is one statement:
/// unanalysable when it may name a fenced table, else left alone, and marked uncertain.
#[test]
fn texts_split_by_the_routine_body_rule_are_taken_whole() {
    let f = fences();
    let hidden = "CREATE FUNCTION f() RETURNS void LANGUAGE sql BEGIN ATOMIC SELECT 1 AS end; \
                  UPDATE x SET a = 1 WHERE id = 2; END; SELECT 1; UPDATE invoices SET paid = true";
    let a = analyze(hidden, &f);
    assert!(a.uncertain);
    assert_eq!(run(hidden, &f), "pf004:0");
    let tamper = "CREATE FUNCTION m(begin int) RETURNS int LANGUAGE sql AS 'select 1'; \
                  DEALLOCATE pgfence_guard_v1; PREPARE pgfence_guard_v1 AS SELECT 1";
    let a = analyze(tamper, &f);
    assert!(a.uncertain);
    // Taken whole, a text that mentions pgfence may declare what pgfence would not see.
    assert_eq!(run(tamper, &f), "pf004:0,1,2");
    let plain = "CREATE FUNCTION m(begin int) RETURNS int LANGUAGE sql AS 'select 1'; SELECT 2";
    assert!(analyze(plain, &f).uncertain);
    assert_eq!(run(plain, &f), "other");
    let escaped = "CREATE FUNCTION g() RETURNS int LANGUAGE sql RETURN CASE WHEN true THEN 1 END; \
                   DO E'BEGIN UPDATE \\x69nvoices SET paid = true; END'";
    assert!(analyze(escaped, &f).uncertain);
    assert_eq!(run(escaped, &f), "pf004:0,1,2");
    // Without a DO or CALL, strings and names inside longer words are not read as names.
    let ordinary = "CREATE FUNCTION g() RETURNS text LANGUAGE sql RETURN CASE WHEN true THEN E'a\\n' END; \
                    SELECT * FROM invoices_archive";
    assert!(analyze(ordinary, &f).uncertain);
    assert_eq!(run(ordinary, &f), "other");
    assert!(!analyze("SELECT 1; UPDATE invoices SET paid = true", &f).uncertain);
    // So is a subscription, which writes tables it does not name.
    let text = "CREATE FUNCTION z() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END; \
                CREATE SUBSCRIPTION s CONNECTION 'dbname=pub' PUBLICATION p";
    assert!(analyze(text, &f).uncertain);
    assert_eq!(run(text, &f), "pf004:0,1,2");
    // A column named `subscription` is no subscription.
    let text = "CREATE FUNCTION z() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END; SELECT subscription FROM t";
    assert_eq!(run(text, &f), "other");
}

fn run(sql: &str, f: &FenceSet) -> String {
    analyze(sql, f)
        .statements
        .iter()
        .map(|s| render(&s.kind))
        .collect::<Vec<_>>()
        .join(" | ")
}

const ROWS: &[(&str, &str)] = &[
    // Reads.
    ("SELECT * FROM invoices", "other"),
    ("SELECT * FROM invoices FOR UPDATE", "other"),
    ("SELECT * FROM invoices FOR NO KEY UPDATE", "other"),
    ("SELECT * FROM invoices FOR KEY SHARE", "other"),
    ("SELECT * FROM invoices FOR SHARE OF invoices NOWAIT", "other"),
    ("SELECT 'a'\n'b' FROM invoices", "other"),
    ("SELECT * INTO new_t FROM invoices", "other"),
    ("TABLE invoices", "other"),
    ("VALUES (1)", "other"),
    ("(SELECT * FROM invoices)", "other"),
    ("SELECT 'DELETE FROM invoices'", "other"),
    ("/* DELETE FROM invoices */ SELECT 1", "other"),
    ("SELECT $$ ; DELETE FROM invoices; $$", "other"),
    (
        "WITH d AS (SELECT * FROM invoices) SELECT * FROM d FOR NO KEY UPDATE",
        "other",
    ),
    // INSERT / upsert.
    ("INSERT INTO invoices VALUES (1)", "write:invoices"),
    (
        "insert into public.invoices (a) values (1) on conflict (a) do update set b = 2",
        "write:invoices",
    ),
    (
        "INSERT INTO invoices VALUES (1) ON CONFLICT DO NOTHING RETURNING *",
        "write:invoices",
    ),
    ("INSERT INTO other SELECT * FROM invoices", "other"),
    // sqlparser would read the ON after a select list as its alias.
    (
        "WITH w AS (INSERT INTO invoices (id) SELECT $1 ON CONFLICT DO NOTHING RETURNING id) SELECT * FROM w",
        "write:invoices",
    ),
    ("INSERT INTO \"invoices\" VALUES (1)", "write:invoices"),
    ("INSERT INTO \"Invoices\" VALUES (1)", "other"),
    ("INSERT INTO INVOICES VALUES (1)", "write:invoices"),
    ("INSERT INTO billing.invoices VALUES (1)", "other"),
    ("INSERT INTO mydb.public.invoices VALUES (1)", "write:invoices"),
    ("INSERT INTO \"Mixed\" VALUES (1)", "write:Mixed"),
    ("INSERT INTO Mixed VALUES (1)", "other"),
    ("INSERT INTO \"invoicés\" VALUES (1)", "other"),
    // UPDATE.
    ("UPDATE invoices SET a = 1", "write:invoices"),
    ("UPDATE ONLY invoices SET a = 1", "write:invoices"),
    (
        "UPDATE other SET a = 1 FROM invoices WHERE other.id = invoices.id",
        "other",
    ),
    (
        "UPDATE invoices i SET a = o.a FROM other o WHERE o.id = i.id",
        "write:invoices",
    ),
    ("UPDATE invoices SET a = 1 WHERE CURRENT OF c", "write:invoices"),
    ("UPDATE other SET a = 1 WHERE CURRENT OF invoices", "other"),
    // DELETE.
    ("DELETE FROM invoices WHERE id = 1", "write:invoices"),
    ("DELETE FROM other USING invoices WHERE other.id = invoices.id", "other"),
    ("DELETE FROM ledger", "write:ledger"),
    ("DELETE FROM public.ledger", "other"),
    ("DELETE FROM invoices WHERE a = 'unterminated", "write:invoices"),
    // MERGE.
    (
        "MERGE INTO invoices t USING src s ON t.id = s.id WHEN MATCHED THEN UPDATE SET a = s.a",
        "write:invoices",
    ),
    (
        "MERGE INTO other t USING invoices s ON t.id = s.id WHEN MATCHED THEN DELETE",
        "other",
    ),
    // COPY.
    ("COPY invoices FROM STDIN", "write:invoices"),
    ("COPY invoices (a, b) FROM STDIN WITH (FORMAT csv)", "write:invoices"),
    ("COPY billing.ledger FROM '/tmp/x'", "write:ledger"),
    ("COPY invoices TO STDOUT", "other"),
    ("COPY (SELECT * FROM invoices) TO STDOUT", "other"),
    ("COPY (DELETE FROM invoices RETURNING *) TO STDOUT", "write:invoices"),
    ("COPY (SELECT ')') TO STDOUT", "other"),
    // TRUNCATE / ALTER / DROP.
    ("TRUNCATE invoices", "write:invoices"),
    ("TRUNCATE TABLE other, billing.ledger", "write:ledger"),
    ("TRUNCATE other", "other"),
    ("TRUNCATE other CASCADE", "write:invoices,ledger,Mixed"),
    ("ALTER TABLE invoices ADD COLUMN x int", "write:invoices"),
    ("ALTER TABLE invoices RENAME TO inv2", "write:invoices"),
    (
        "ALTER TABLE IF EXISTS ONLY invoices RENAME COLUMN a TO b",
        "write:invoices",
    ),
    (
        "ALTER TABLE other ADD FOREIGN KEY (a) REFERENCES invoices (id)",
        "other",
    ),
    ("DROP TABLE invoices", "write:invoices"),
    ("DROP TABLE IF EXISTS other, invoices", "write:invoices"),
    ("DROP SCHEMA billing", "write:ledger"),
    // CASCADE reaches whatever depends on the objects dropped (a column of a
    // dropped type, a foreign key), DROP OWNED whatever a role owns.
    (
        "DROP TABLE IF EXISTS other, invoices CASCADE",
        "write:invoices,ledger,Mixed",
    ),
    ("DROP SCHEMA billing CASCADE", "write:invoices,ledger,Mixed"),
    ("DROP TYPE mood CASCADE", "write:invoices,ledger,Mixed"),
    ("drop function f(int) cascade", "write:invoices,ledger,Mixed"),
    ("DROP OWNED BY bob", "write:invoices,ledger,Mixed"),
    // An extension's member tables go with it, or move, or its update script writes them.
    ("DROP EXTENSION autoinc", "write:invoices,ledger,Mixed"),
    ("DROP EXTENSION IF EXISTS nosuch", "write:invoices,ledger,Mixed"),
    ("ALTER EXTENSION autoinc SET SCHEMA s2", "write:invoices,ledger,Mixed"),
    // An update script is no more visible than a function's body (documented).
    ("alter extension postgis update", "other"),
    ("ALTER EXTENSION hstore UPDATE TO '1.8'", "other"),
    // A subscription writes local tables later, where no guard runs.
    (
        "CREATE SUBSCRIPTION s CONNECTION 'dbname=pub' PUBLICATION p",
        "pf004:0,1,2",
    ),
    ("ALTER SUBSCRIPTION s REFRESH PUBLICATION", "pf004:0,1,2"),
    ("ALTER SUBSCRIPTION s ENABLE", "pf004:0,1,2"),
    ("ALTER SUBSCRIPTION s SET PUBLICATION p2", "pf004:0,1,2"),
    (
        "alter subscription s add publication p2 with (copy_data = false)",
        "pf004:0,1,2",
    ),
    // Forms that start no writes: pg_dump's, and the way to drop one whose slot is gone.
    ("ALTER SUBSCRIPTION s DISABLE", "other"),
    ("ALTER SUBSCRIPTION s SET (slot_name = NONE)", "other"),
    ("ALTER SUBSCRIPTION s OWNER TO bob", "other"),
    // pg_dump's form, and publications changed without a refresh.
    (
        "CREATE SUBSCRIPTION s CONNECTION 'dbname=pub' PUBLICATION p WITH (connect = false, slot_name = 's')",
        "other",
    ),
    (
        "CREATE SUBSCRIPTION s CONNECTION 'dbname=pub' PUBLICATION p WITH (enabled = 'off')",
        "other",
    ),
    (
        "ALTER SUBSCRIPTION s SET PUBLICATION p2 WITH (refresh = false)",
        "other",
    ),
    // Matviews are dumped WITH NO DATA, which sqlparser does not read; they read.
    (
        "CREATE MATERIALIZED VIEW mv AS SELECT * FROM invoices WITH NO DATA",
        "other",
    ),
    ("DROP SUBSCRIPTION s", "other"),
    ("CREATE EXTENSION autoinc", "other"),
    (
        "ALTER TYPE addr DROP ATTRIBUTE zip CASCADE",
        "write:invoices,ledger,Mixed",
    ),
    ("DROP TYPE mood", "other"),
    // Owners and tablespaces change nothing a table holds (documented).
    ("REASSIGN OWNED BY bob TO alice", "other"),
    // Every column of a domain, every table in a tablespace.
    // A domain's default applies to rows written later, its owner to nothing in the table
    // (pg_dump writes `ALTER DOMAIN … OWNER TO` for every domain).
    ("ALTER DOMAIN dpos SET DEFAULT 99", "other"),
    ("ALTER DOMAIN public.dpos OWNER TO bob", "other"),
    ("ALTER TABLE ALL IN TABLESPACE pg_default SET TABLESPACE ts1", "other"),
    ("ALTER TABLE allx SET TABLESPACE ts1", "other"),
    // Linking a child or partition in a form sqlparser cannot read: the fallback does not
    // follow the operand, so a text naming a fenced table is refused.
    ("ALTER TABLE other * INHERIT invoices", "pf004:0"),
    ("ALTER TABLE other CLUSTER ON i, INHERIT invoices", "pf004:0"),
    (
        "ALTER TABLE pp * ATTACH PARTITION invoices FOR VALUES FROM (0) TO (10)",
        "pf004:0",
    ),
    ("ALTER TABLE pp * DETACH PARTITION invoices", "pf004:0"),
    // A column of that name links nothing: the target is written, under its guard.
    ("ALTER TABLE invoices * ADD COLUMN detach bool", "write:invoices"),
    ("ALTER SCHEMA billing RENAME TO b2", "write:ledger"),
    ("DROP VIEW invoices_v", "other"),
    ("DROP INDEX invoices_idx", "other"),
    // Other DDL.
    ("CREATE INDEX ON invoices (a)", "other"),
    ("CREATE VIEW v AS SELECT * FROM invoices", "other"),
    // Definitions that read or describe a fenced table, which sqlparser does not read.
    ("CREATE VIEW v AS SELECT * FROM invoices WITH CHECK OPTION", "other"),
    (
        "CREATE OR REPLACE TEMP VIEW v AS SELECT * FROM invoices WITH LOCAL CHECK OPTION",
        "other",
    ),
    ("CREATE STATISTICS st (ndistinct) ON a, b FROM invoices", "other"),
    ("CREATE PUBLICATION p FOR TABLE invoices", "other"),
    ("CREATE PUBLICATION p FOR TABLE invoices WHERE (a > 1)", "other"),
    ("CREATE TABLE t2 AS SELECT * FROM invoices", "other"),
    ("CREATE TABLE t2 AS EXECUTE p", "execute p"),
    (
        "CREATE TEMP TABLE t2 (a, b) AS EXECUTE p (1, 'x') WITH NO DATA",
        "execute p",
    ),
    ("create table t2 as execute p with data", "execute p"),
    // The words elsewhere are no EXECUTE: the statement is read for what it is.
    (
        "CREATE TEMP TABLE t2 AS WITH u AS (DELETE FROM invoices RETURNING id) SELECT id AS execute FROM u",
        "write:invoices",
    ),
    ("CREATE VIEW v AS SELECT 1 AS execute FROM pg_class", "other"),
    ("CREATE TABLE t2 AS SELECT 1 AS execute WITH DATA", "other"),
    // After the words, a reserved word and parentheses are no statement name and
    // arguments: the statement is read from its start, in the grammar's shape.
    (
        "CREATE TABLE t2 AS WITH u AS (UPDATE invoices SET a = 1 RETURNING id) SELECT 1 AS execute WHERE (true)",
        "write:invoices",
    ),
    (
        "CREATE TEMP TABLE IF NOT EXISTS t2 (a) AS WITH u AS (DELETE FROM invoices RETURNING id) \
         SELECT 1 AS EXECUTE where (1=1) with data",
        "pf004:0",
    ),
    (
        "create global temp table if not exists s.t2 (a, b) using heap with (fillfactor = 70) \
         on commit preserve rows tablespace pg_default as execute U&\"p!0031\" uescape '!' (1, ')') with no data",
        "execute p1",
    ),
    (
        "CREATE UNLOGGED TABLE t2 WITHOUT OIDS ON COMMIT DROP AS EXECUTE \"P\"",
        "execute P",
    ),
    // The words at the top level of a CREATE TABLE in no shape the grammar has.
    ("CREATE TABLE t2 ON COMMIT KEEP AS EXECUTE p", "pf004:0,1,2"),
    // `if` is unreserved: a table or schema may be named so.
    ("CREATE TABLE if AS EXECUTE p", "execute p"),
    ("CREATE TABLE if.t2 AS SELECT 1 AS execute", "other"),
    ("CREATE TABLE IF NOT EXISTS if AS EXECUTE p", "execute p"),
    ("CREATE TABLE IF NOT if AS EXECUTE p", "pf004:0,1,2"),
    ("CREATE TABLE t2 (LIKE invoices)", "other"),
    // What pg_dump writes beside a fenced table's definition.
    (
        "ALTER SEQUENCE public.invoices_id_seq OWNED BY public.invoices.id",
        "other",
    ),
    ("ALTER SEQUENCE IF EXISTS s OWNED BY billing.ledger.id", "other"),
    ("ALTER PUBLICATION p ADD TABLE ONLY public.invoices", "other"),
    (
        "ALTER PUBLICATION p SET TABLE invoices WHERE (a > 1), billing.ledger",
        "other",
    ),
    (
        "ALTER SEQUENCE s OWNED BY invoices.id CASCADE",
        "write:invoices,ledger,Mixed",
    ),
    // (sqlparser does not read these: the lexer finds only a new table's column list.)
    ("CREATE TABLE t2 (LIKE invoices INCLUDING ALL)", "other"),
    (
        "CREATE UNLOGGED TABLE IF NOT EXISTS s.t2 (id int, LIKE billing.ledger EXCLUDING ALL) WITH (fillfactor = 70)",
        "other",
    ),
    (
        "CREATE TEMP TABLE t2 (LIKE invoices INCLUDING ALL) ON COMMIT DROP",
        "other",
    ),
    (
        "CREATE TABLE kid (LIKE invoices INCLUDING ALL) INHERITS (invoices)",
        "pf004:0",
    ),
    (
        "CREATE TABLE t2 (a, b) AS SELECT 1, 2 FROM invoices EXCLUDING ALL",
        "pf004:0",
    ),
    (
        "CREATE TABLE t2 (LIKE invoices INCLUDING ALL, d int DEFAULT f_update())",
        "other",
    ),
    // A child's rows show in its parent's scans.
    ("CREATE TABLE kid () INHERITS (invoices)", "write:invoices"),
    (
        "CREATE TABLE kid (x int) INHERITS (other, billing.ledger)",
        "write:ledger",
    ),
    (
        "CREATE TABLE p3 PARTITION OF invoices FOR VALUES FROM (1) TO (10)",
        "write:invoices",
    ),
    ("CREATE TABLE p4 PARTITION OF invoices DEFAULT", "write:invoices"),
    ("CREATE TABLE kid () INHERITS (other)", "other"),
    ("ALTER TABLE other INHERIT invoices", "write:invoices"),
    ("ALTER TABLE other NO INHERIT billing.ledger", "write:ledger"),
    (
        "ALTER TABLE other ATTACH PARTITION invoices FOR VALUES IN (1)",
        "write:invoices",
    ),
    ("ALTER TABLE other DETACH PARTITION invoices", "write:invoices"),
    ("ALTER TABLE other DETACH PARTITION p1", "other"),
    // Postgres renames a table by ALTER INDEX, ALTER VIEW and ALTER MATERIALIZED VIEW too.
    ("ALTER INDEX invoices RENAME TO inv2", "write:invoices"),
    // (sqlparser does not read this form: refused, as it names a fenced table.)
    ("ALTER INDEX IF EXISTS billing.invoices RENAME TO inv2", "pf004:0"),
    ("ALTER VIEW invoices RENAME COLUMN a TO b", "write:invoices"),
    ("ALTER VIEW IF EXISTS invoices RENAME TO inv2", "write:invoices"),
    (
        "ALTER MATERIALIZED VIEW invoices RENAME COLUMN a TO b",
        "write:invoices",
    ),
    (
        "ALTER MATERIALIZED VIEW IF EXISTS invoices RENAME TO inv2",
        "write:invoices",
    ),
    ("ALTER INDEX invoices_pkey RENAME TO i2", "other"),
    ("ALTER VIEW v RENAME TO v2", "other"),
    // FETCH and MOVE run a portal, which the session may have bound to a write.
    ("FETCH ALL FROM p", "fetch all,from,p"),
    ("FETCH p", "fetch p"),
    ("MOVE FORWARD 5 IN \"P q\"", "fetch forward,in,P q"),
    ("fetch -2 from U&\"\\0070\"", "fetch from,p"),
    ("FETCH NEXT FROM U&\"!\" UESCAPE '!'", "fetch next,from,?"),
    (
        "CREATE FUNCTION f() RETURNS void LANGUAGE sql AS $$ DELETE FROM invoices $$",
        "other",
    ),
    (
        "CREATE TRIGGER t BEFORE INSERT ON invoices FOR EACH ROW EXECUTE FUNCTION f()",
        "write:invoices",
    ),
    (
        "CREATE RULE r AS ON INSERT TO other DO INSTEAD DELETE FROM invoices",
        "pf004:0",
    ),
    ("GRANT SELECT ON invoices TO bob", "other"),
    ("COMMENT ON TABLE invoices IS 'x'", "other"),
    // Data-modifying CTEs.
    (
        "WITH d AS (DELETE FROM invoices RETURNING *) SELECT * FROM d",
        "write:invoices",
    ),
    (
        "WITH d AS (SELECT * FROM invoices) INSERT INTO other SELECT * FROM d",
        "other",
    ),
    (
        "WITH d AS (SELECT 1) INSERT INTO invoices SELECT * FROM d",
        "write:invoices",
    ),
    (
        "WITH RECURSIVE r AS (SELECT 1 UNION ALL SELECT 1 FROM r) UPDATE invoices SET a = 1",
        "write:invoices",
    ),
    (
        "WITH a AS (UPDATE ledger SET x = 1 RETURNING *), b AS (DELETE FROM invoices) TABLE a",
        "write:invoices,ledger",
    ),
    // `key` is a column name here, not part of `FOR NO KEY UPDATE`; sqlparser
    // cannot parse CYCLE / SEARCH, so these fail closed.
    (
        "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM t WHERE n<2) \
         CYCLE n SET is_cycle USING key UPDATE invoices SET v=v+1 WHERE id=1",
        "pf004:0",
    ),
    (
        "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM t WHERE n<2) \
         SEARCH DEPTH FIRST BY n SET key UPDATE invoices SET v=v+1 WHERE id=1",
        "pf004:0",
    ),
    // EXPLAIN.
    ("EXPLAIN DELETE FROM invoices", "other"),
    ("EXPLAIN ANALYZE DELETE FROM invoices", "write:invoices"),
    ("EXPLAIN (ANALYZE) DELETE FROM invoices", "write:invoices"),
    ("EXPLAIN (ANALYZE false, VERBOSE) DELETE FROM invoices", "other"),
    ("EXPLAIN (ANALYZE off) DELETE FROM invoices", "other"),
    (
        "EXPLAIN (ANALYZE true, BUFFERS) UPDATE invoices SET a = 1",
        "write:invoices",
    ),
    (
        "EXPLAIN (FORMAT json, ANALYZE) UPDATE invoices SET a = 1",
        "write:invoices",
    ),
    ("EXPLAIN ANALYZE SELECT * FROM invoices", "other"),
    ("EXPLAIN ANALYZE EXECUTE p", "execute p"),
    (
        "EXPLAIN ANALYSE VERBOSE INSERT INTO invoices VALUES (1)",
        "write:invoices",
    ),
    ("EXPLAIN (ANALYZE DELETE FROM invoices", "pf004:0"),
    // Option names are identifiers; values other than a false spelling are on.
    ("EXPLAIN (\"analyze\") UPDATE invoices SET a = 1", "write:invoices"),
    ("EXPLAIN (\"analyse\" true) DELETE FROM invoices", "write:invoices"),
    ("EXPLAIN (U&\"\\0061nalyze\") DELETE FROM invoices", "write:invoices"),
    (
        "EXPLAIN (U&\"!0061nalyze\" UESCAPE '!' on) DELETE FROM invoices",
        "write:invoices",
    ),
    ("EXPLAIN (analyze on) DELETE FROM invoices", "write:invoices"),
    ("EXPLAIN (analyze 1) DELETE FROM invoices", "write:invoices"),
    ("EXPLAIN (ANALYZE 0.0) DELETE FROM invoices", "write:invoices"),
    ("EXPLAIN (ANALYZE -1) DELETE FROM invoices", "write:invoices"),
    ("EXPLAIN (ANALYZE --0\n) DELETE FROM invoices", "write:invoices"),
    // Signed and padded zeros are the integer 0 to Postgres: off.
    ("EXPLAIN (ANALYZE - 0) DELETE FROM invoices", "other"),
    ("EXPLAIN (ANALYZE -0) DELETE FROM invoices", "other"),
    ("EXPLAIN (ANALYZE +0) DELETE FROM invoices", "other"),
    ("EXPLAIN (ANALYZE -00) DELETE FROM invoices", "other"),
    ("EXPLAIN (ANALYZE 'of'\n'f') DELETE FROM invoices", "write:invoices"),
    ("EXPLAIN (ANALYZE 0) DELETE FROM invoices", "other"),
    ("EXPLAIN (ANALYZE \"OFF\") DELETE FROM invoices", "other"),
    ("EXPLAIN (ANALYZE 'False') DELETE FROM invoices", "other"),
    ("EXPLAIN (ANALYZE, ANALYZE false) DELETE FROM invoices", "other"),
    // Names that may only be ANALYZE turn it on, never off.
    ("EXPLAIN (\"ANALYZE\") DELETE FROM invoices", "write:invoices"),
    ("EXPLAIN (U&\"\\0000\") DELETE FROM invoices", "write:invoices"),
    (
        "EXPLAIN (ANALYZE, \"Analyze\" off) DELETE FROM invoices",
        "write:invoices",
    ),
    ("EXPLAIN (VERBOSE, \"costs\" off) DELETE FROM invoices", "other"),
    // SQL-level prepared statements.
    ("PREPARE p AS DELETE FROM invoices", "prepare p:write:invoices"),
    (
        "PREPARE P (int, numeric(10,2)) AS UPDATE invoices SET a = $1",
        "prepare p:write:invoices",
    ),
    ("PREPARE q AS SELECT * FROM invoices", "prepare q:other"),
    ("PREPARE \"Q\" AS SELECT 1", "prepare Q:other"),
    ("PREPARE TRANSACTION 'x'", "end:commit"),
    ("prepare transaction E'x' ", "end:commit"),
    ("PREPARE TRANSACTION $$x$$", "end:commit"),
    // Without the string, `transaction` names an ordinary prepared statement.
    ("PREPARE transaction AS SELECT 1", "prepare transaction:other"),
    (
        "PREPARE Transaction (int) AS DELETE FROM invoices",
        "prepare transaction:write:invoices",
    ),
    ("EXECUTE p", "execute p"),
    ("EXECUTE P(1, 'a')", "execute p"),
    ("DEALLOCATE p", "deallocate p"),
    ("DEALLOCATE PREPARE \"P\"", "deallocate P"),
    ("DEALLOCATE ALL", "deallocate all"),
    ("CLOSE pp", "close pp"),
    ("close \"Pp\"", "close Pp"),
    ("CLOSE ALL", "close-all"),
    ("CLOSE \"all\"", "close all"),
    ("CLOSE U&\"\\0070\"", "close p"),
    ("CLOSE U&\"\\0000\"", "other"),
    ("CLOSE a b", "other"),
    // U&"…" statement names decode as Postgres decodes them; unreadable ones fail closed.
    (
        "PREPARE U&\"\\0070\" AS DELETE FROM invoices",
        "prepare p:write:invoices",
    ),
    ("EXECUTE U&\"\\0070\"(1)", "execute p"),
    ("EXPLAIN ANALYZE EXECUTE U&\"!0070\" UESCAPE '!'", "execute p"),
    ("CREATE TABLE t2 AS EXECUTE U&\"\\0070\"", "execute p"),
    ("DEALLOCATE U&\"pgfence_guard_v1\"", "deallocate pgfence_guard_v1"),
    ("DEALLOCATE PREPARE U&\"P!0031\" UESCAPE '!'", "deallocate P1"),
    ("PREPARE U&\"\\D800\" AS SELECT 1", "pf004:0,1,2"),
    ("EXECUTE U&\"\\0000\"", "pf004:0,1,2"),
    ("DEALLOCATE U&\"\\0000\"", "pf004:0,1,2"),
    ("DEALLOCATE U&\"p\" UESCAPE 'é'", "pf004:0,1,2"),
    // CALL / DO.
    ("CALL purge()", "other"),
    ("CALL purge('invoices')", "pf004:0"),
    ("DO $$ BEGIN DELETE FROM invoices; END $$", "pf004:0"),
    ("DO $$ BEGIN PERFORM 1; END $$", "other"),
    ("DO E'BEGIN DELETE FROM \\x69nvoices; END'", "pf004:0,1,2"),
    ("DO U&'BEGIN DELETE FROM \\0069nvoices; END'", "pf004:0,1,2"),
    // A Unicode-escaped target is decoded as Postgres decodes it (no case folding); one
    // that does not decode fails closed.
    ("SELECT * FROM U&\"\\0069nvoices\"", "other"),
    ("DELETE FROM U&\"\\0069nvoices\"", "write:invoices"),
    ("update U&\"plai\\006e\" set v = 'u' where id = 1", "other"),
    (
        "INSERT INTO u&\"!0069nvoices\" UESCAPE '!' VALUES (1)",
        "write:invoices",
    ),
    ("UPDATE U&\"billing\".U&\"\\006Cedger\" SET a = 1", "write:ledger"),
    (
        "MERGE INTO U&\"Mi\\0078ed\" m USING s ON true WHEN MATCHED THEN DELETE",
        "write:Mixed",
    ),
    ("UPDATE U&\"mi\\0078ed\" SET a = 1", "other"),
    ("TRUNCATE plain, U&\"\\0069nvoices\"", "write:invoices"),
    ("COPY U&\"\\0069nvoices\" FROM STDIN", "write:invoices"),
    ("DELETE FROM U&\"\\D800nvoices\"", "pf004:0,1,2"),
    ("DELETE FROM U&\"\\00e9t\\00e9\"", "pf004:0,1,2"),
    ("DELETE FROM billing.U&\"l\\00e9dger\"", "pf004:0,1,2"),
    ("DELETE FROM U&\"!0069nvoices\" UESCAPE 'ab'", "pf004:0,1,2"),
    ("WITH d AS (DELETE FROM U&\"\\0069nvoices\") SELECT 1", "pf004:0,1,2"),
    (
        "UPDATE x SET a = 1 FROM U&\"\\0069nvoices\" i WHERE x.id = i.id",
        "other",
    ),
    // Declarations and harmless commands.
    ("SET pgfence.epoch = 5", "declare"),
    ("SET LOCAL pgfence.fence TO 'x'", "declare"),
    ("SET pgfence.epoch = 1, 2", "declare"),
    ("SET search_path = billing", "other"),
    ("RESET ALL", "declare"),
    ("DISCARD ALL", "declare"),
    ("SHOW pgfence.epoch", "other"),
    // Savepoints: names normalised as identifiers.
    ("SAVEPOINT s1", "Define(\"s1\")"),
    ("savepoint \"_pg3_1\"", "Define(\"_pg3_1\")"),
    ("RELEASE SAVEPOINT S1", "Release(\"s1\")"),
    ("RELEASE s1", "Release(\"s1\")"),
    ("RELEASE savepoint", "Release(\"savepoint\")"),
    ("ROLLBACK TO s1", "RollbackTo(\"s1\")"),
    ("ROLLBACK WORK TO SAVEPOINT \"S 1\"", "RollbackTo(\"S 1\")"),
    ("rollback transaction to savepoint", "RollbackTo(\"savepoint\")"),
    // U&"…" names decode as Postgres decodes them (escapes, UESCAPE, surrogate pairs, no folding).
    ("SAVEPOINT U&\"S\\0031\"", "Define(\"S1\")"),
    (
        "ROLLBACK TO SAVEPOINT u&\"d!0061t!+000061\" UESCAPE '!'",
        "RollbackTo(\"data\")",
    ),
    ("RELEASE U&\"a\\\\b\"\"c\"", "Release(\"a\\\\b\\\"c\")"),
    ("SAVEPOINT U&\"\\D83D\\DE00\"", "Define(\"\u{1f600}\")"),
    // An escape character given by any string constant, as Postgres takes it.
    ("ROLLBACK TO U&\"!0061\" UESCAPE E'!'", "RollbackTo(\"a\")"),
    ("SAVEPOINT U&\"!0061\" UESCAPE $x$!$x$", "Define(\"a\")"),
    // Names pgfence cannot read (Postgres refuses most): they may do anything.
    ("RELEASE SAVEPOINT U&\"\\0000\"", "pf004:"),
    ("SAVEPOINT U&\"\\D83D\"", "pf004:"),
    ("SAVEPOINT U&\"x\\12\"", "pf004:"),
    ("SAVEPOINT U&\"x\" UESCAPE 'a'", "pf004:"),
    ("SAVEPOINT U&\"\"", "pf004:"),
    // Transaction ends: what they do to declarations is known before the command tag.
    ("ROLLBACK", "end:rollback"),
    ("ROLLBACK AND NO CHAIN", "end:rollback"),
    ("rollback work and chain", "end:rollback+chain"),
    ("ROLLBACK TRANSACTION AND /* c */ CHAIN", "end:rollback+chain"),
    ("ABORT AND CHAIN", "end:rollback+chain"),
    ("END AND NO CHAIN", "end:commit"),
    ("ABORT TRANSACTION", "end:rollback"),
    ("ROLLBACK PREPARED 'gid'", "other"),
    ("COMMIT", "end:commit"),
    ("commit and chain", "end:commit+chain"),
    ("END WORK", "end:commit"),
    ("PREPARE TRANSACTION 'gid'", "end:commit"),
    ("COMMIT PREPARED 'gid'", "other"),
    ("SAVEPOINT", "other"),
    ("VACUUM ANALYZE invoices", "other"),
    ("ANALYZE invoices", "other"),
    ("REINDEX TABLE invoices", "other"),
    ("CLUSTER invoices USING idx", "other"),
    ("LOCK TABLE invoices IN EXCLUSIVE MODE", "other"),
    ("NOTIFY invoices, 'x'", "other"),
    // Multi-statement strings and hostile splitting.
    (
        "BEGIN; INSERT INTO invoices VALUES (1); SELECT 1; COMMIT",
        "other | write:invoices | other | end:commit",
    ),
    ("SELECT 1; DELETE FROM invoices -- ; x", "other | write:invoices"),
    ("SELECT 'ü;'; DELETE FROM invoices", "other | write:invoices"),
    ("SELECT E'\\';DELETE FROM invoices'", "other"),
    // A literal continued over a newline keeps the first segment's kind: `\'`
    // does not end the escape string's second segment.
    (
        "SELECT E'x'\n'\\'; SELECT 1; --' ; UPDATE invoices SET v = v + 100 WHERE id = 1",
        "other | write:invoices",
    ),
    (
        "SELECT E'x' -- c\n  -- d\n'\\'; SELECT 1; --'\n; DELETE FROM invoices",
        "other | write:invoices",
    ),
    (
        "SELECT U&'x'\n'\\'; DELETE FROM invoices; --'",
        "other | write:invoices",
    ),
    // Without a newline between them, two literals stay two (a syntax error).
    ("SELECT E'x' '\\'; DELETE FROM invoices; --'", "other | write:invoices"),
    // sqlparser would read the second segment as a plain string: the lexer decides.
    (
        "WITH a AS (SELECT E'x'\n'\\' --'), u AS (UPDATE invoices SET v = 1 RETURNING 1) SELECT * FROM a, u",
        "pf004:0",
    ),
    ("UPDATE invoices SET note = E'a'\n'\\' WHERE id = 1", "write:invoices"),
    (
        "SELECT \"a;\"; UPDATE \"invoices\" SET a = 1;;",
        "other | write:invoices",
    ),
    ("SELECT 1 /* /* ; */ DELETE FROM invoices; */", "other"),
    // `ONLY (t)`, as Postgres' grammar has it.
    ("UPDATE ONLY (invoices) SET a = 1", "write:invoices"),
    ("DELETE FROM ONLY (invoices)", "write:invoices"),
    ("TRUNCATE ONLY (invoices)", "write:invoices"),
    ("TRUNCATE TABLE ONLY (plain), ONLY (billing.ledger)", "write:ledger"),
    ("TRUNCATE ONLY (plain)", "other"),
    ("ALTER TABLE ONLY (invoices) ADD COLUMN x int", "write:invoices"),
    ("UPDATE ONLY (plain) SET a = 1", "other"),
    ("DELETE FROM ONLY (public.plain) WHERE a = 1", "other"),
    // Not Postgres' grammar (its syntax error, whatever the epoch): read as a write all
    // the same, which is safe.
    ("INSERT INTO ONLY (invoices) VALUES (1)", "write:invoices"),
    ("", ""),
    (" ; -- nothing\n ; ", ""),
];

#[test]
fn classification_table() {
    let f = fences();
    let mut failures = Vec::new();
    for (sql, want) in ROWS {
        let got = run(sql, &f);
        if got != *want {
            failures.push(format!("{sql:?}\n   want {want}\n    got {got}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows differ:\n{}",
        failures.len(),
        ROWS.len(),
        failures.join("\n")
    );
}

#[test]
fn without_fences_nothing_is_a_write() {
    let none = FenceSet::new(Vec::new());
    for (sql, _) in ROWS {
        for s in analyze(sql, &none).statements {
            assert!(
                !matches!(s.kind, StmtKind::Write { .. } | StmtKind::Unanalysable { .. }),
                "{sql}"
            );
        }
    }
}

#[test]
fn odd_configured_names_match_their_quoted_spelling() {
    let f = FenceSet::new(vec![
        (TableName::parse_config("public.\"we\"\"ird\"").unwrap(), FenceId(7)),
        (TableName::parse_config("CAFÉ").unwrap(), FenceId(8)),
        (TableName::parse_config(&"l".repeat(70)).unwrap(), FenceId(9)),
    ]);
    assert_eq!(run("UPDATE \"we\"\"ird\" SET x = 1", &f), "write:we\"ird");
    assert_eq!(run("UPDATE weird SET x = 1", &f), "other");
    assert_eq!(run("DELETE FROM CAFÉ", &f), "write:cafÉ");
    assert_eq!(run("DELETE FROM \"café\"", &f), "other");
    // Postgres truncates both spellings to 63 bytes.
    assert_eq!(
        run(&format!("TRUNCATE {}", "l".repeat(80)), &f),
        format!("write:{}", "l".repeat(63))
    );
}

#[test]
fn spans_cover_the_statements() {
    let sql = "  SELECT 1 ;\n/* c */ DELETE FROM invoices WHERE a = ';' ; ";
    let a = analyze(sql, &fences());
    let texts: Vec<&str> = a.statements.iter().map(|s| &sql[s.span.clone()]).collect();
    assert_eq!(texts, vec!["SELECT 1", "DELETE FROM invoices WHERE a = ';'"]);
}

#[test]
fn standard_conforming_strings_off_changes_the_split() {
    let sql = r"SELECT 'x\''; DELETE FROM invoices; --'";
    let mut an = Analyzer::new(fences());
    assert_eq!(an.analyze(sql).statements.len(), 1);
    an.set_standard_conforming_strings(false);
    let kinds: Vec<String> = an.analyze(sql).statements.iter().map(|s| render(&s.kind)).collect();
    assert_eq!(kinds, vec!["other", "write:invoices"]);
}

#[test]
fn standard_conforming_strings_off_continues_plain_strings_as_escape_strings() {
    let off = Lexing {
        standard_conforming_strings: false,
    };
    let kinds = |sql: &str| -> Vec<String> {
        analyze_lexing(sql, &fences(), off)
            .statements
            .iter()
            .map(|s| render(&s.kind))
            .collect()
    };
    assert_eq!(
        kinds("SELECT 'x'\n'\\'; SELECT 1; --' ; DELETE FROM invoices"),
        vec!["other", "write:invoices"]
    );
    assert_eq!(
        kinds("SELECT N'x' -- c\r'\\'; SELECT 1; --'\n; DELETE FROM invoices"),
        vec!["other", "write:invoices"]
    );
    // sqlparser would take the backslash literally and see `WITH a AS (SELECT 'x\\') SELECT 1`.
    let hidden = "WITH a AS (SELECT 'x\\' --'), u AS (UPDATE invoices SET v = 1 RETURNING 1) SELECT 1 /*\n\
                  ) SELECT 1 -- */, 2";
    assert_eq!(kinds(hidden), vec!["pf004:0"]);
}

#[test]
fn analyzer_caches_and_stays_bounded() {
    let mut an = Analyzer::new(fences());
    let with = |v: &str| format!("WITH u AS (UPDATE invoices SET a = {v} RETURNING a) SELECT * FROM u");
    let a = an.analyze(&with("1"));
    let b = an.analyze(&with("1"));
    assert!(Arc::ptr_eq(&a, &b));
    for i in 0..CACHE_ENTRIES + 10 {
        an.analyze(&with(&i.to_string()));
    }
    assert!(an.cache.len() <= CACHE_ENTRIES);
    // A 16 KB statement is cached too, and long ones stay within the byte budget.
    let long = with(&format!("'{}'", "x".repeat(16 * 1024)));
    let a = an.analyze(&long);
    assert!(Arc::ptr_eq(&a, &an.analyze(&long)));
    for i in 0..300 {
        an.analyze(&with(&format!("'{}' || {i}", "y".repeat(60 * 1024))));
    }
    assert!(an.cache.key_bytes() <= CACHE_BYTES);
    // Fast-path texts (no fenced name, or a plain DML statement the lexer reads) are not
    // cached at all.
    an.cache.clear();
    an.analyze("SELECT 1");
    an.analyze("UPDATE invoices SET a = 1");
    assert!(an.cache.is_empty());
    // Parse texts come again (drivers re-send the unnamed statement per execution), so
    // short ones are kept whatever they cost, with the same result as analysing afresh,
    // apart from the parsed results.
    let parse = "SELECT abalance FROM pgbench_accounts WHERE aid = $1";
    let first = an.analyze_repeated(parse);
    assert!(Arc::ptr_eq(&first, &an.analyze_repeated(parse)));
    assert_eq!(*first, analyze(parse, &fences()));
    let write = "UPDATE invoices SET a = $1";
    assert!(Arc::ptr_eq(&an.analyze_repeated(write), &an.analyze_repeated(write)));
    assert_eq!(*an.analyze_repeated(write), analyze(write, &fences()));
    assert!(an.cache.is_empty());
    assert_eq!(an.repeated.len(), 2);
    // A parsed Parse text is kept once, with the parsed results.
    let cte = with("$1");
    assert!(Arc::ptr_eq(&an.analyze_repeated(&cte), &an.analyze(&cte)));
    assert_eq!((an.cache.len(), an.repeated.len()), (1, 2));
    // A stream of one-off Parse texts does not evict parsed results, and stays bounded;
    // long ones are not kept.
    for i in 0..REPEATED_ENTRIES * 4 {
        an.analyze_repeated(&format!("SELECT {i}"));
        an.analyze_repeated(&format!("SELECT '{}', {i}", "z".repeat(REPEATED_MAX_TEXT)));
    }
    assert_eq!(an.cache.len(), 1);
    assert!(an.repeated.len() <= REPEATED_ENTRIES);
    assert!(an.repeated.keys().all(|k| k.len() <= REPEATED_MAX_TEXT));
}

#[test]
fn deep_nesting_fails_closed_without_overflowing() {
    let f = fences();
    let deep = format!("{}1{}", "(".repeat(100_000), ")".repeat(100_000));
    assert_eq!(run(&format!("SELECT {deep} FROM invoices"), &f), "other");
    assert_eq!(
        run(&format!("DELETE FROM invoices WHERE a = {deep}"), &f),
        "write:invoices"
    );
    assert_eq!(run(&format!("DELETE FROM other WHERE a = {deep}"), &f), "other");
    let cte = format!("WITH d AS (SELECT {deep}) DELETE FROM invoices");
    assert_eq!(run(&cte, &f), "pf004:0");
    let explain = format!("{}DELETE FROM invoices", "EXPLAIN ANALYZE ".repeat(10_000));
    assert_eq!(run(&explain, &f), "pf004:0");
    let copies = format!(
        "{}DELETE FROM invoices{}",
        "COPY (".repeat(10_000),
        ") TO STDOUT".repeat(10_000)
    );
    assert_eq!(run(&copies, &f), "pf004:0");
}

#[test]
fn large_and_garbage_inputs_are_handled() {
    let f = fences();
    let values = vec!["(1, 'x;y')"; 20_000].join(", ");
    assert_eq!(
        run(&format!("INSERT INTO invoices VALUES {values}"), &f),
        "write:invoices"
    );
    assert_eq!(run(&format!("INSERT INTO other VALUES {values}"), &f), "other");
    // 1 MB of pseudo-random printable garbage with fenced names sprinkled in.
    let mut x: u32 = 12345;
    let mut garbage = String::with_capacity(1 << 20);
    while garbage.len() < 1 << 20 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        match x >> 24 {
            0..=3 => garbage.push_str(" invoices "),
            4..=5 => garbage.push('é'),
            n => garbage.push(char::from(b' ' + (n as u8 % 95))),
        }
    }
    let a = analyze(&garbage, &f);
    for s in &a.statements {
        assert!(garbage.is_char_boundary(s.span.start) && garbage.is_char_boundary(s.span.end));
    }
    // A 60 KB garbage statement goes through sqlparser.
    let cut = (0..60_000).rev().find(|&i| garbage.is_char_boundary(i)).unwrap_or(0);
    let _ = analyze(&garbage[..cut], &f);
}

fn sqlish() -> impl Strategy<Value = String> {
    let atoms = prop_oneof![
        Just("SELECT "),
        Just("INSERT INTO "),
        Just("UPDATE "),
        Just("DELETE FROM "),
        Just("WITH d AS ("),
        Just("invoices"),
        Just("billing.ledger"),
        Just("\"Mixed\""),
        Just("U&\"\\0069\""),
        Just("'"),
        Just("E'\\'"),
        Just("$$"),
        Just("$a$"),
        Just("\""),
        Just("("),
        Just(")"),
        Just(";"),
        Just("--"),
        Just("\n"),
        Just("/*"),
        Just("*/"),
        Just("EXPLAIN ANALYZE "),
        Just("COPY "),
        Just(" FROM "),
        Just(" TO "),
        Just("PREPARE p AS "),
        Just("EXECUTE "),
        Just("SET pgfence.epoch = "),
        Just("DO "),
        Just("CALL "),
        Just("ü"),
        Just(" , "),
        Just("1"),
    ];
    proptest::collection::vec(atoms, 0..24).prop_map(|v| v.concat())
}

proptest! {
    #[test]
    fn analyze_never_panics_and_spans_are_sound(sql in prop_oneof![any::<String>(), sqlish()]) {
        let a = analyze(&sql, &fences());
        let mut last = 0;
        for s in &a.statements {
            prop_assert!(last <= s.span.start && s.span.start < s.span.end && s.span.end <= sql.len());
            prop_assert!(sql.is_char_boundary(s.span.start) && sql.is_char_boundary(s.span.end));
            last = s.span.end;
        }
    }

    #[test]
    fn analyzer_agrees_with_analyze(sql in sqlish()) {
        let mut an = Analyzer::new(fences());
        let first = an.analyze(&sql);
        prop_assert_eq!(&*first, &analyze(&sql, &fences()));
        prop_assert_eq!(&*an.analyze(&sql), &*first);
    }
}

/// The lexer's reading of a plain INSERT/UPDATE/DELETE/MERGE target agrees with sqlparser's
/// classification, so skipping the parse for those statements changes no verdict.
#[test]
fn plain_dml_targets_agree_with_the_parser() {
    let f = fences();
    let statements = [
        "INSERT INTO invoices VALUES (1)",
        "INSERT INTO public.invoices (id, note) VALUES (1, 'x') RETURNING *",
        "insert into INVOICES select * from other",
        "INSERT INTO other SELECT * FROM invoices",
        "INSERT INTO invoices AS i VALUES (1) ON CONFLICT (id) DO UPDATE SET note = i.note",
        "INSERT INTO billing.ledger DEFAULT VALUES",
        "INSERT INTO ledger VALUES (1)",
        "INSERT INTO \"Mixed\" VALUES (1)",
        "INSERT INTO mixed VALUES (1)",
        "UPDATE invoices SET note = 'a' WHERE id = 1",
        "UPDATE ONLY invoices * SET note = 'a'",
        "UPDATE invoices AS i SET note = o.note FROM other o WHERE o.id = i.id",
        "UPDATE other SET note = (SELECT note FROM invoices LIMIT 1)",
        "UPDATE other o SET note = i.note FROM invoices i WHERE i.id = o.id",
        "UPDATE billing.ledger SET a = 1",
        "UPDATE \"billing\".\"ledger\" SET a = 1",
        "UPDATE other.invoices SET a = 1",
        "DELETE FROM invoices WHERE id IN (SELECT id FROM other)",
        "DELETE FROM other USING invoices WHERE other.id = invoices.id",
        "DELETE FROM ONLY billing.ledger",
        "MERGE INTO invoices t USING other s ON t.id = s.id WHEN MATCHED THEN DELETE",
        "MERGE INTO other t USING invoices s ON t.id = s.id WHEN MATCHED THEN UPDATE SET a = 1",
    ];
    for sql in statements {
        let lower = sql.to_ascii_lowercase();
        let ctx = Ctx {
            sql,
            lower: lower.as_bytes(),
            fences: &f,
            lexing: Lexing::default(),
            parsed: false,
            parse_budget: PARSE_BUDGET,
        };
        let first = split::first_word(sql, Lexing::default()).unwrap().to_ascii_lowercase();
        let fast = ctx
            .plain_dml(&(0..sql.len()), &first)
            .expect("the lexer reads the target");
        // What sqlparser cannot parse (`UPDATE ONLY t *`) went to the same lexer reading before.
        let Some(stmt) = ast::parse(sql) else {
            assert_eq!(render(&fast), render(&ctx.fallback(&(0..sql.len()), &first)), "{sql}");
            continue;
        };
        let hits = ast::classify(&stmt, &f);
        assert!(!hits.unknown, "{sql}");
        assert_eq!(render(&fast), render(&hits.into_write(&f)), "{sql}");
    }
}

/// Past `MAX_STATEMENTS` a text is taken whole: PF004 if it may name a fenced table,
/// passed on otherwise, instead of a record for each of millions of statements.
#[test]
fn a_text_of_too_many_statements_is_taken_whole() {
    let f = fences();
    let many = "select 1;".repeat(split::MAX_STATEMENTS);
    let under = analyze(&many, &f);
    assert_eq!(under.statements.len(), split::MAX_STATEMENTS);
    assert!(!under.uncertain);
    for (tail, expected) in [("select 2", "other"), ("delete from invoices", "pf004:0")] {
        let text = format!("{many}{tail}");
        let a = analyze(&text, &f);
        assert!(a.uncertain, "{tail}");
        let kinds: Vec<String> = a.statements.iter().map(|s| render(&s.kind)).collect();
        assert_eq!(kinds, [expected], "{tail}");
        assert_eq!(a.statements[0].span, 0..text.len());
    }
}

/// sqlparser reads at most `PARSE_BUDGET` bytes of one text; later statements that need
/// it take the token fallback, as a statement over `MAX_PARSE_BYTES` does: a write in a
/// WITH is then PF004 (fail closed) instead of a write the parser found.
#[test]
fn statements_past_the_parse_budget_take_the_token_fallback() {
    let f = fences();
    let pad = "x".repeat(60 * 1024);
    let stmt = format!("with d as (delete from invoices returning *) select * from d where note = '{pad}';");
    let n = PARSE_BUDGET / stmt.len() + 2;
    let a = analyze(&stmt.repeat(n), &f);
    let kinds: Vec<String> = a.statements.iter().map(|s| render(&s.kind)).collect();
    assert_eq!(kinds.len(), n);
    let parsed = PARSE_BUDGET / (stmt.len() - 1);
    assert!(
        kinds[..parsed].iter().all(|k| k == "write:invoices"),
        "{:?}",
        &kinds[..parsed]
    );
    assert!(kinds[parsed..].iter().all(|k| k == "pf004:0"), "{:?}", &kinds[parsed..]);
}

/// A text taken whole is refused when any part of it can write a fenced table without
/// naming it, or declares an epoch pgfence would not see; other texts pass.
#[test]
fn a_text_taken_whole_refuses_what_can_write_without_naming() {
    let f = fences();
    let many = "select 1;".repeat(split::MAX_STATEMENTS);
    for (tail, expected) in [
        ("execute w", "pf004:0,1,2"),
        ("create table x as execute w", "pf004:0,1,2"),
        ("drop schema public cascade", "pf004:0,1,2"),
        ("alter table other rename to x", "pf004:0,1,2"),
        ("truncate other cascade", "pf004:0,1,2"),
        ("set pgfence.epoch = 3", "pf004:0,1,2"),
        ("fetch all from p", "pf004:0,1,2"),
        ("move all in p", "pf004:0,1,2"),
        ("reset all", "pf004:0,1,2"),
        ("discard all", "pf004:0,1,2"),
        ("rollback to savepoint s", "pf004:0,1,2"),
        ("abort", "pf004:0,1,2"),
        ("savepoint s", "pf004:0,1,2"),
        ("release s", "pf004:0,1,2"),
        ("deallocate w; prepare w as update other set a = 1", "pf004:0,1,2"),
        ("commit", "other"),
        // Those words elsewhere than where a statement starts are clauses or names.
        ("select a from other fetch first 1 row only", "other"),
        ("select release, reset from other", "other"),
        ("select 'execute' from other", "other"),
        ("update other set a = 1", "other"),
        // As for a DO or CALL on its own: an escape could spell a fenced name.
        (r"do E'begin update \x69nvoices set paid = true; end'", "pf004:0,1,2"),
        (r"call run(E'update \x69nvoices set paid = true')", "pf004:0,1,2"),
        ("do 'begin update invoices set paid = true; end'", "pf004:0"),
    ] {
        let a = analyze(&format!("{many}{tail}"), &f);
        let kinds: Vec<String> = a.statements.iter().map(|s| render(&s.kind)).collect();
        assert_eq!(kinds, [expected], "{tail}");
    }
    // Without fences nothing is refused.
    let a = analyze(&format!("{many}execute w"), &FenceSet::new(Vec::new()));
    assert_eq!(render(&a.statements[0].kind), "other");
}
