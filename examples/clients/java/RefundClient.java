// SPDX-License-Identifier: Apache-2.0
/*
 * RefundClient.java -- the token flow against idem serve, the JDK only
 * (java.net.http, Java 11 or later).
 *
 * Issues a one-time token (POST /_idem/v1/tokens), submits a refund with it,
 * submits it again (Idem answers with the first answer: Idempotent-Replayed),
 * then tries another refund with the spent token (409 token_spent, whose
 * detail is the configuration's text for people). Exits 0 when every answer
 * is the one Idem promises, 1 otherwise.
 *
 *   javac -d out RefundClient.java && java -cp out RefundClient [BASE_URL [SUBJECT [REFUND_NO]]]
 */
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

public final class RefundClient {
    private static final HttpClient HTTP = HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1)
            .connectTimeout(Duration.ofSeconds(10))
            .build();
    private static final PrintStream OUT =
            new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);

    private RefundClient() {
    }

    private static HttpResponse<String> post(String base, String path, String subject, String json,
                                             String token) throws Exception {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(base + path))
                .timeout(Duration.ofSeconds(10))
                .header("Content-Type", "application/json")
                .header("X-Subject", subject)
                .POST(HttpRequest.BodyPublishers.ofString(json, StandardCharsets.UTF_8));
        if (token != null) {
            b.header("Idem-Token", token);
        }
        return HTTP.send(b.build(), HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
    }

    /* A string member of a flat JSON object; enough for Idem's answers here
     * (tokens and problem types hold no escapes). */
    private static String member(String json, String name) {
        Matcher m = Pattern.compile("\"" + Pattern.quote(name) + "\"\\s*:\\s*\"((?:[^\"\\\\]|\\\\.)*)\"")
                .matcher(json);
        return m.find() ? m.group(1) : null;
    }

    private static String refund(String refundNo) {
        return "{\"refund_no\":\"" + refundNo + "\",\"amount\":\"1.00\"}";
    }

    public static void main(String[] args) throws Exception {
        String base = args.length > 0 ? args[0].replaceAll("/+$", "") : "http://127.0.0.1:8080";
        String subject = args.length > 1 ? args[1] : "alice";
        String refundNo = args.length > 2 ? args[2] : "R-java-" + System.currentTimeMillis();

        HttpResponse<String> r = post(base, "/_idem/v1/tokens", subject, "{\"scene\":\"refund\"}", null);
        String token = member(r.body(), "token");
        if (r.statusCode() != 201 || token == null) {
            OUT.println("issue: " + r.statusCode() + " " + r.body());
            System.exit(1);
        }
        OUT.println("token: issued");

        HttpResponse<String> first = post(base, "/refunds", subject, refund(refundNo), token);
        OUT.println("submit: " + first.statusCode() + " " + first.body().trim() + " (kept until "
                + first.headers().firstValue("Idempotency-Key-Expires").orElse("?") + ")");
        if (first.statusCode() != 201 || first.headers().firstValue("Idempotent-Replayed").isPresent()) {
            System.exit(1);
        }

        HttpResponse<String> again = post(base, "/refunds", subject, refund(refundNo), token);
        boolean replayed = again.headers().firstValue("Idempotent-Replayed").orElse("").equals("true");
        OUT.println("again: " + again.statusCode() + " replayed=" + replayed + " " + again.body().trim());
        if (again.statusCode() != 201 || !replayed || !again.body().equals(first.body())) {
            System.exit(1);
        }

        HttpResponse<String> spent = post(base, "/refunds", subject, refund(refundNo + "-other"), token);
        String type = member(spent.body(), "type");
        OUT.println("spent token: " + spent.statusCode() + " " + type + ": " + member(spent.body(), "detail"));
        System.exit(spent.statusCode() == 409 && "urn:idem:token_spent".equals(type) ? 0 : 1);
    }
}
