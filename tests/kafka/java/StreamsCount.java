import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

/**
 * A Kafka Streams application with processing.guarantee=exactly_once_v2, driven by
 * tests/kafka/test_java_clients.py: per key of the input topic, the number of records seen
 * so far and the last value, "N:value", written to the output topic for every input record
 * (no cache, so no update is folded into a later one). Exactly once means: for each key the
 * output holds "1:v1", "2:v2", ... "N:vN" once each, in input order.
 *
 *   java StreamsCount bootstrap=H:P input=T output=T app=ID state=DIR stop=FILE [threads=2]
 *
 * Runs until the file `stop` exists; state changes and replaced threads as JSON lines.
 */
public final class StreamsCount {
    public static void main(String[] argv) throws Exception {
        Map<String, String> a = JavaClients.args(argv, 0);
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(a.get("input"), Consumed.with(Serdes.String(), Serdes.String()))
            .groupByKey()
            .aggregate(() -> "0:", (key, value, aggregate) ->
                           (Long.parseLong(aggregate.substring(0, aggregate.indexOf(':'))) + 1) + ":" + value,
                       Materialized.with(Serdes.String(), Serdes.String()))
            .toStream()
            .to(a.get("output"), Produced.with(Serdes.String(), Serdes.String()));

        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, a.get("app"));
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 3);
        p.put(StreamsConfig.topicPrefix("min.insync.replicas"), 2);
        p.put(StreamsConfig.STATE_DIR_CONFIG, a.get("state"));
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(a.getOrDefault("threads", "2")));
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 10_000);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 1_000);
        p.put(StreamsConfig.producerPrefix(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG), 10_000);
        p.put(StreamsConfig.producerPrefix(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG), 10_000);
        p.put(StreamsConfig.producerPrefix(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG), 60_000);
        p.put(StreamsConfig.RECONNECT_BACKOFF_MAX_MS_CONFIG, 1_000);

        AtomicInteger replaced = new AtomicInteger();
        KafkaStreams streams = new KafkaStreams(builder.build(), p);
        streams.setStateListener((now, before) ->
            JavaClients.emit(JavaClients.line("state", now.toString(), "from", before.toString())));
        streams.setUncaughtExceptionHandler(e -> {
            JavaClients.emit(JavaClients.line("thread_died", JavaClients.errorName(e), "message", String.valueOf(e.getMessage()),
                                              "replaced", replaced.incrementAndGet()));
            return StreamThreadExceptionResponse.REPLACE_THREAD;
        });
        streams.start();
        Path stop = Path.of(a.get("stop"));
        while (!Files.exists(stop)) {
            Thread.sleep(100);
            if (streams.state() == KafkaStreams.State.ERROR || streams.state() == KafkaStreams.State.NOT_RUNNING) break;
        }
        boolean closed = streams.close(Duration.ofSeconds(30));
        JavaClients.emit(JavaClients.line("closed", closed, "final_state", streams.state().toString(),
                                          "threads_replaced", replaced.get()));
    }
}
