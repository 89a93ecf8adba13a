import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Base64;

import org.apache.kafka.common.utils.Exit;

/**
 * Kafka's command-line tools, one after another in one JVM (tests/peers/tool_runner.py): a
 * JVM start costs seconds on two cores, a tool run in a warm one a fraction of that.
 *
 * Each request is one line on stdin: base64 of the stdin to give the tool, then the main class
 * and its arguments, tab-separated and each base64-encoded. The answer is one line on stdout:
 * "@@@ <exit code> <base64 stdout> <base64 stderr>". A tool's Exit.exit (and System.exit)
 * ends its run with that code, as it would end the JVM; what it prints after its first exit
 * (a catch-all handler reporting the exit itself) is cut, as a real exit would never print it.
 */
public final class ToolRunner {
    /** Thrown where the tool would have ended the JVM. */
    static final class ToolExit extends SecurityException {
        final int code;

        ToolExit(int code) {
            super("exit " + code);
            this.code = code;
        }
    }

    static final class Capture extends ByteArrayOutputStream {
        int frozenAt = -1; // size when the tool first exited: later output is cut

        byte[] kept() {
            byte[] all = toByteArray();
            return frozenAt < 0 ? all : Arrays.copyOf(all, frozenAt);
        }
    }

    private static Capture out;
    private static Capture err;
    private static Integer firstExit;

    private static void exited(int code) {
        if (firstExit == null) {
            firstExit = code;
            System.out.flush();
            System.err.flush();
            out.frozenAt = out.size();
            err.frozenAt = err.size();
        }
        throw new ToolExit(code);
    }

    @SuppressWarnings("removal")
    public static void main(String[] ignored) throws Exception {
        PrintStream realOut = System.out;
        PrintStream realErr = System.err;
        InputStream realIn = System.in;
        Exit.setExitProcedure((code, message) -> exited(code));
        Exit.setHaltProcedure((code, message) -> exited(code));
        System.setSecurityManager(new SecurityManager() {
            @Override
            public void checkExit(int status) {
                if (out != null) {
                    exited(status);
                }
            }

            @Override
            public void checkPermission(java.security.Permission perm) {
            }

            @Override
            public void checkPermission(java.security.Permission perm, Object context) {
            }
        });
        BufferedReader requests = new BufferedReader(new InputStreamReader(realIn, StandardCharsets.UTF_8));
        Base64.Decoder b64 = Base64.getDecoder();
        Base64.Encoder enc = Base64.getEncoder();
        String line;
        while ((line = requests.readLine()) != null) {
            String[] fields = line.split("\t", -1);
            byte[] input = b64.decode(fields[0]);
            String mainClass = new String(b64.decode(fields[1]), StandardCharsets.UTF_8);
            String[] args = new String[fields.length - 2];
            for (int i = 2; i < fields.length; i++) {
                args[i - 2] = new String(b64.decode(fields[i]), StandardCharsets.UTF_8);
            }
            out = new Capture();
            err = new Capture();
            firstExit = null;
            PrintStream toolOut = new PrintStream(out, true, StandardCharsets.UTF_8);
            PrintStream toolErr = new PrintStream(err, true, StandardCharsets.UTF_8);
            System.setOut(toolOut);
            System.setErr(toolErr);
            System.setIn(new ByteArrayInputStream(input));
            int code = 0;
            try {
                Method main = Class.forName(mainClass).getMethod("main", String[].class);
                main.invoke(null, (Object) args);
            } catch (InvocationTargetException e) {
                Throwable cause = e.getCause();
                while (cause != null && !(cause instanceof ToolExit) && cause.getCause() != null
                        && cause.getCause() != cause) {
                    cause = cause.getCause();
                }
                if (!(cause instanceof ToolExit) && firstExit == null) {
                    // An exception out of main ends a JVM with 1 and its stack trace.
                    e.getCause().printStackTrace(toolErr);
                    code = 1;
                }
            } catch (ToolExit e) {
                // exited while being looked up (a static initializer)
            } catch (Throwable t) {
                t.printStackTrace(toolErr);
                code = 1;
            } finally {
                toolOut.flush();
                toolErr.flush();
                System.setOut(realOut);
                System.setErr(realErr);
                System.setIn(realIn);
            }
            if (firstExit != null) {
                code = firstExit;
            }
            realOut.println("@@@ " + code + " " + enc.encodeToString(out.kept()) + " "
                    + enc.encodeToString(err.kept()));
            realOut.flush();
            out = null;
            err = null;
        }
    }
}
