// pgjdbc against pgfence: the contract checked with the JDBC driver.
//
// Usage: java -cp /usr/share/java/postgresql.jar JdbcCompat.java [HOST PORT DB [USER]]
//
// The database must hold the seed's tables (leader_lease with a 'sweeper' row, sweep_state fenced
// by fence "sweeper" with that lease, audit unfenced) and `pgfence init` must have run. Prints one
// PASS/FAIL line per check and exits non-zero if any check failed.

import java.io.StringReader;
import java.io.StringWriter;
import java.sql.BatchUpdateException;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Savepoint;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

import org.postgresql.PGConnection;
import org.postgresql.copy.CopyManager;

public class JdbcCompat {
    static String host = "127.0.0.1", db = "postgres", user = "postgres";
    static int port = 6432;
    static final String FENCE = "sweeper";
    static final List<String> FAILED = new ArrayList<>();
    static long e1;

    interface Check {
        void run() throws Exception;
    }

    static void check(String name, Check c) {
        try {
            c.run();
            System.out.println("PASS " + name);
        } catch (Throwable t) {
            FAILED.add(name);
            System.out.println("FAIL " + name + ": " + t);
            t.printStackTrace(System.out);
        }
        System.out.flush();
    }

    static void ok(boolean cond, String what) {
        if (!cond) {
            throw new AssertionError(what);
        }
    }

    /// A connection; `epoch` (null: none) declared with `-c` in `options`; `props` as "k=v".
    static Connection connect(Long epoch, String... props) throws SQLException {
        Properties p = new Properties();
        p.setProperty("user", user);
        p.setProperty("connectTimeout", "10");
        if (epoch != null) {
            p.setProperty("options", "-c pgfence.epoch=" + epoch);
        }
        for (String kv : props) {
            int at = kv.indexOf('=');
            p.setProperty(kv.substring(0, at), kv.substring(at + 1));
        }
        return DriverManager.getConnection("jdbc:postgresql://" + host + ":" + port + "/" + db, p);
    }

    static String one(Connection c, String sql) throws SQLException {
        try (Statement s = c.createStatement(); ResultSet r = s.executeQuery(sql)) {
            r.next();
            return r.getString(1);
        }
    }

    /// The seed's acquire (expiring the lease first), through pgfence: leader_lease is not fenced.
    static long takeover(String holder) throws SQLException {
        try (Connection c = connect(null)) {
            c.createStatement().execute("UPDATE leader_lease SET expires_at = '-infinity' WHERE name = 'sweeper'");
            PreparedStatement ps = c.prepareStatement(
                "UPDATE leader_lease SET holder = ?, epoch = epoch + 1, expires_at = now() + interval '30 s' "
                    + "WHERE name = ? AND (holder IS NULL OR holder = ? OR expires_at < now()) RETURNING epoch");
            ps.setString(1, holder);
            ps.setString(2, FENCE);
            ps.setString(3, holder);
            ResultSet r = ps.executeQuery();
            r.next();
            return r.getLong(1);
        }
    }

    static String note() throws SQLException {
        try (Connection c = connect(null)) {
            return one(c, "SELECT note FROM sweep_state WHERE id = 1");
        }
    }

    static int count(String sql) throws SQLException {
        try (Connection c = connect(null)) {
            return Integer.parseInt(one(c, sql));
        }
    }

    /// The SQLSTATE `c` throws (or "ok"), and the exception.
    static SQLException expectState(String expected, Check c) throws Exception {
        try {
            c.run();
        } catch (SQLException e) {
            ok(expected.equals(e.getSQLState()), "expected " + expected + ", got " + e.getSQLState() + ": " + e);
            return e;
        }
        throw new AssertionError("expected " + expected + ", got success");
    }

    static String staleMessage(long declared, long current) {
        return "pgfence: epoch " + declared + " is stale for fence \"" + FENCE + "\" (current epoch " + current + ")";
    }

    static int update(Connection c, String note) throws SQLException {
        try (PreparedStatement ps = c.prepareStatement("UPDATE sweep_state SET note = ? WHERE id = 1")) {
            ps.setString(1, note);
            return ps.executeUpdate();
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length > 0) host = args[0];
        if (args.length > 1) port = Integer.parseInt(args[1]);
        if (args.length > 2) db = args[2];
        if (args.length > 3) user = args[3];
        e1 = takeover("jdbc-a");

        check("options_declares_the_epoch_and_show_agrees", () -> {
            try (Connection c = connect(e1)) {
                ok(one(c, "SHOW pgfence.epoch").equals(Long.toString(e1)), "SHOW");
                ok(one(c, "SELECT current_setting('pgfence.epoch')").equals(Long.toString(e1)), "current_setting");
                ok(update(c, "jdbc-current") == 1, "update count");
            }
            ok(note().equals("jdbc-current"), "note");
        });

        // pgjdbc prepares on the server (statement S_n) from the prepareThreshold-th execution.
        for (String threshold : new String[] {"0", "1", "5"}) {
            check("prepared_statement_with_prepare_threshold_" + threshold + "_then_stale_then_usable", () -> {
                long stale;
                try (Connection c = connect(e1, "prepareThreshold=" + threshold);
                        PreparedStatement ps = c.prepareStatement("UPDATE sweep_state SET note = ? WHERE id = 1")) {
                    for (int i = 0; i < 7; i++) {
                        ps.setString(1, "jdbc-" + i);
                        ok(ps.executeUpdate() == 1, "update " + i);
                    }
                    stale = e1;
                    e1 = takeover("jdbc-" + threshold);
                    ps.setString(1, "stale");
                    SQLException e = expectState("PF001", ps::executeUpdate);
                    ok(e.getMessage().contains(staleMessage(stale, e1)), e.getMessage());
                    ok(one(c, "SELECT 41 + 1").equals("42"), "usable");
                    // Declaring the new epoch lets the same statement write again.
                    c.createStatement().execute("SET pgfence.epoch = " + e1);
                    ps.setString(1, "jdbc-after");
                    ok(ps.executeUpdate() == 1, "after SET");
                }
                ok(note().equals("jdbc-after"), "note");
            });
        }

        check("error_sqlstates_and_hints", () -> {
            try (Connection c = connect(null)) {
                SQLException e = expectState("PF002", () -> update(c, "none"));
                ok(e.getMessage().contains(FENCE), e.getMessage());
                ok(e.getMessage().contains("Hint"), "a hint: " + e.getMessage());
                expectState("PF003", () -> c.createStatement().execute("SET pgfence.epoch = 0"));
                expectState("PF003", () -> c.createStatement().execute("SET pgfence.epoch = 'abc'"));
                c.createStatement().execute("SET pgfence.epoch = " + (e1 + 5));
                expectState("PF003", () -> update(c, "future"));
                ok(one(c, "SELECT 1").equals("1"), "usable");
            }
            ok(!note().equals("none") && !note().equals("future"), "nothing written");
        });

        check("invalid_startup_epoch_fails_the_connection_with_pf003", () -> {
            SQLException e = expectState("PF003", () -> connect(null, "options=-c pgfence.epoch=0").close());
            ok(e.getMessage().contains("pgfence"), e.getMessage());
        });

        check("rejected_write_in_a_transaction_commits_nothing", () -> {
            long stale = e1 - 1;
            try (Connection c = connect(stale)) {
                c.setAutoCommit(false);
                c.createStatement().execute("INSERT INTO audit (note) VALUES ('jdbc-must-vanish')");
                expectState("PF001", () -> update(c, "stale"));
                expectState("25P02", () -> one(c, "SELECT 1"));
                c.commit(); // COMMIT of an aborted transaction rolls back
                c.setAutoCommit(true);
                ok(one(c, "SELECT 1").equals("1"), "usable");
            }
            ok(count("SELECT count(*) FROM audit WHERE note = 'jdbc-must-vanish'") == 0, "audit row gone");
            ok(!note().equals("stale"), "note");
        });

        check("a_savepoint_rolls_back_a_rejected_write_and_the_transaction_goes_on", () -> {
            try (Connection c = connect(e1)) {
                c.setAutoCommit(false);
                c.createStatement().execute("INSERT INTO audit (note) VALUES ('jdbc-kept')");
                Savepoint sp = c.setSavepoint();
                c.createStatement().execute("SET LOCAL pgfence.epoch = " + (e1 - 1));
                expectState("PF001", () -> update(c, "stale"));
                c.rollback(sp);
                // The rollback to the savepoint undid the SET LOCAL too: the epoch is current again.
                ok(one(c, "SHOW pgfence.epoch").equals(Long.toString(e1)), "epoch after rollback to savepoint");
                ok(update(c, "jdbc-savepoint") == 1, "write after the savepoint");
                c.commit();
            }
            ok(note().equals("jdbc-savepoint"), "note");
            ok(count("SELECT count(*) FROM audit WHERE note = 'jdbc-kept'") == 1, "audit row kept");
        });

        check("set_local_ends_with_the_transaction_and_reset_returns_to_the_startup_value", () -> {
            try (Connection c = connect(e1)) {
                c.setAutoCommit(false);
                c.createStatement().execute("SET LOCAL pgfence.epoch = " + (e1 - 1));
                expectState("PF001", () -> update(c, "stale"));
                c.rollback();
                ok(one(c, "SHOW pgfence.epoch").equals(Long.toString(e1)), "after rollback");
                c.setAutoCommit(true);
                c.createStatement().execute("SET pgfence.epoch = " + (e1 - 1));
                expectState("PF001", () -> update(c, "stale"));
                c.createStatement().execute("RESET pgfence.epoch");
                ok(update(c, "jdbc-reset") == 1, "after RESET");
            }
            ok(note().equals("jdbc-reset"), "note");
        });

        for (String rewrite : new String[] {"false", "true"}) {
            check("execute_batch_current_then_stale_leaves_nothing_reWriteBatchedInserts_" + rewrite, () -> {
                try (Connection c = connect(e1, "reWriteBatchedInserts=" + rewrite)) {
                    c.createStatement().execute("DELETE FROM sweep_state WHERE id >= 100");
                    PreparedStatement ins = c.prepareStatement("INSERT INTO sweep_state (id, note) VALUES (?, ?)");
                    for (int i = 100; i < 110; i++) {
                        ins.setInt(1, i);
                        ins.setString(2, "batch");
                        ins.addBatch();
                    }
                    int[] counts = ins.executeBatch();
                    ok(counts.length == 10, "counts");
                    c.createStatement().execute("SET pgfence.epoch = " + (e1 - 1));
                    c.setAutoCommit(false);
                    for (int i = 110; i < 120; i++) {
                        ins.setInt(1, i);
                        ins.setString(2, "stale-batch");
                        ins.addBatch();
                    }
                    SQLException e = expectState("PF001", ins::executeBatch);
                    ok(e instanceof BatchUpdateException, "a BatchUpdateException: " + e);
                    c.rollback();
                    c.setAutoCommit(true);
                }
                ok(count("SELECT count(*) FROM sweep_state WHERE note = 'batch'") == 10, "current batch landed");
                ok(count("SELECT count(*) FROM sweep_state WHERE note = 'stale-batch'") == 0, "stale batch left nothing");
            });
        }

        check("copy_in_current_lands_and_stale_is_refused", () -> {
            try (Connection c = connect(e1)) {
                c.createStatement().execute("DELETE FROM sweep_state WHERE id >= 100");
                CopyManager cm = c.unwrap(PGConnection.class).getCopyAPI();
                long n = cm.copyIn("COPY sweep_state (id, note) FROM STDIN WITH (FORMAT csv)", new StringReader("200,copied\n201,copied\n"));
                ok(n == 2, "copied " + n);
                StringWriter out = new StringWriter();
                cm.copyOut("COPY (SELECT id FROM sweep_state WHERE note = 'copied' ORDER BY id) TO STDOUT", out);
                ok(out.toString().equals("200\n201\n"), out.toString());
                c.createStatement().execute("SET pgfence.epoch = " + (e1 - 1));
                expectState("PF001", () -> cm.copyIn("COPY sweep_state (id, note) FROM STDIN WITH (FORMAT csv)", new StringReader("202,stale\n")));
                ok(one(c, "SELECT 1").equals("1"), "usable");
            }
            ok(count("SELECT count(*) FROM sweep_state WHERE id = 202") == 0, "stale copy left nothing");
        });

        check("fetch_size_reads_through_a_portal_in_a_transaction", () -> {
            try (Connection c = connect(null)) {
                c.setAutoCommit(false);
                PreparedStatement ps = c.prepareStatement("SELECT g FROM generate_series(1, 1000) g");
                ps.setFetchSize(10);
                ResultSet r = ps.executeQuery();
                long sum = 0;
                while (r.next()) {
                    sum += r.getLong(1);
                }
                ok(sum == 500500, "sum " + sum);
                c.commit();
            }
        });

        check("query_timeout_cancels_through_pgfence", () -> {
            try (Connection c = connect(null); Statement s = c.createStatement()) {
                s.setQueryTimeout(1);
                expectState("57014", () -> s.execute("SELECT pg_sleep(20)"));
                ok(one(c, "SELECT 1").equals("1"), "usable after cancel");
                ok(c.isValid(5), "isValid");
            }
        });

        check("generated_keys_and_metadata", () -> {
            try (Connection c = connect(e1)) {
                PreparedStatement ps = c.prepareStatement("INSERT INTO audit (note) VALUES (?)", Statement.RETURN_GENERATED_KEYS);
                ps.setString(1, "jdbc-key");
                ps.executeUpdate();
                ResultSet k = ps.getGeneratedKeys();
                ok(k.next() && k.getInt("id") > 0, "generated key");
                ResultSet t = c.getMetaData().getTables(null, "public", "sweep_state", null);
                ok(t.next(), "getTables");
            }
        });

        System.out.println("jdbc: " + FAILED.size() + " check(s) failed" + (FAILED.isEmpty() ? "" : ": " + String.join(", ", FAILED)));
        System.exit(FAILED.isEmpty() ? 0 : 1);
    }
}
