import com.fasterxml.jackson.databind.ObjectMapper;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Kafka's Java clients driven from pytest (tests/kafka/test_java_clients.py): one mode per
 * run, arguments as key=value, every result a JSON line on stdout (the clients log to stderr).
 *
 *   java JavaClients idempotent bootstrap=H:P topic=T count=N partitions=P [compression=lz4]
 *   java JavaClients transactional bootstrap=H:P topic=T partitions=P txn=ID group=G
 *   java JavaClients group bootstrap=H:P topic=T group=G protocol=classic|consumer count=N partitions=P
 *   java JavaClients admin bootstrap=H:P prefix=NAME
 *   java JavaClients sessions bootstrap=H:P first=T first_partitions=P first_count=N second=T2
 *        second_partitions=P2 second_count=N2 keep=K late=L
 *   java JavaClients spread bootstrap=H:P prefix=P topics=T partitions=P records=N
 *   java JavaClients share bootstrap=H:P topic=T group=G count=N partitions=P
 *   java JavaClients share-renew bootstrap=H:P topic=T group=G count=N lock_ms=L hold_ms=H
 *   java JavaClients share-script bootstrap=H:P   (commands as JSON lines on stdin, see shareScript)
 *
 * A client call that throws is reported as {"error": "<exception class>"} in its result, so
 * the same run can be compared against Kafka field by field.
 */
public final class JavaClients {
    static final ObjectMapper JSON = new ObjectMapper();

    static synchronized void emit(Map<String, ?> line) {
        try {
            System.out.println(JSON.writeValueAsString(line));
            System.out.flush();
        } catch (Exception e) {
            throw new RuntimeException(e);
        }
    }

    /** key=value arguments from argv[first] on. */
    static Map<String, String> args(String[] argv, int first) {
        Map<String, String> out = new HashMap<>();
        for (int i = first; i < argv.length; i++) {
            int eq = argv[i].indexOf('=');
            if (eq < 0) throw new IllegalArgumentException("argument " + argv[i] + " is not key=value");
            out.put(argv[i].substring(0, eq), argv[i].substring(eq + 1));
        }
        return out;
    }

    static Map<String, Object> line(Object... kv) {
        Map<String, Object> out = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) out.put((String) kv[i], kv[i + 1]);
        return out;
    }

    /** The exception's class, unwrapped from the futures' ExecutionException. */
    static String errorName(Throwable e) {
        while ((e instanceof ExecutionException || e instanceof org.apache.kafka.common.KafkaException
                && e.getClass() == org.apache.kafka.common.KafkaException.class) && e.getCause() != null) {
            e = e.getCause();
        }
        return e.getClass().getSimpleName();
    }

    /** A call's value, or {"error": class} when it throws. */
    static Object attempt(Callable call) {
        try {
            return call.call();
        } catch (Exception e) {
            return line("error", errorName(e));
        }
    }

    interface Callable {
        Object call() throws Exception;
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> a = args(argv, 1);
        switch (argv[0]) {
            case "idempotent" -> idempotent(a);
            case "transactional" -> transactional(a);
            case "group" -> group(a);
            case "admin" -> admin(a);
            case "sessions" -> sessions(a);
            case "share" -> share(a);
            case "share-renew" -> shareRenew(a);
            case "share-script" -> shareScript(a);
            case "spread" -> spread(a);
            default -> throw new IllegalArgumentException("unknown mode " + argv[0]);
        }
    }

    /**
     * A KafkaShareConsumer (KIP-932) in explicit acknowledgement mode: warm-up records until
     * every partition delivered one (a share partition starts at the log end), then `count`
     * records "job-N"; every fourth is RELEASEd on its first delivery, the rest ACCEPTed, each
     * commitSync's results checked. Emits {"records": [[partition, offset, deliveryCount,
     * n]], "accepted": k} or {"error": ...}.
     */
    static void share(Map<String, String> a) throws Exception {
        String topic = a.get("topic");
        int count = Integer.parseInt(a.get("count"));
        int partitions = Integer.parseInt(a.get("partitions"));
        Properties c = new Properties();
        c.put("bootstrap.servers", a.get("bootstrap"));
        c.put("group.id", a.get("group"));
        c.put("key.deserializer", StringDeserializer.class.getName());
        c.put("value.deserializer", StringDeserializer.class.getName());
        c.put("share.acknowledgement.mode", "explicit");
        List<List<Integer>> records = new ArrayList<>();
        Set<Integer> accepted = new HashSet<>();
        try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(c);
             KafkaProducer<String, String> producer = new KafkaProducer<>(producerProps(a))) {
            consumer.subscribe(List.of(topic));
            Set<Integer> warm = new HashSet<>();
            long last = System.currentTimeMillis();
            while (warm.size() < partitions) {
                for (int q = 0; q < partitions; q++) producer.send(new ProducerRecord<>(topic, q, null, "warm"));
                producer.flush();
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(300))) {
                    if (!r.value().equals("warm")) throw new IllegalStateException("a job before the warm-up ended");
                    if (warm.add(r.partition())) last = System.currentTimeMillis();
                    consumer.acknowledge(r, AcknowledgeType.ACCEPT);
                }
                if (System.currentTimeMillis() - last > 60_000) {
                    emit(line("error", "warm-up: partitions " + warm + " delivered"));
                    return;
                }
            }
            for (int i = 0; i < count; i++) producer.send(new ProducerRecord<>(topic, i % partitions, null, "job-" + i));
            producer.flush();
            last = System.currentTimeMillis();
            while (accepted.size() < count) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(300))) {
                    last = System.currentTimeMillis();
                    if (r.value().equals("warm")) {
                        consumer.acknowledge(r, AcknowledgeType.ACCEPT);
                        continue;
                    }
                    int n = Integer.parseInt(r.value().substring(4));
                    int delivery = r.deliveryCount().map(Short::intValue).orElse(-1);
                    records.add(List.of(r.partition(), (int) r.offset(), delivery, n));
                    if (n % 4 == 0 && delivery == 1) {
                        consumer.acknowledge(r, AcknowledgeType.RELEASE);
                    } else {
                        consumer.acknowledge(r, AcknowledgeType.ACCEPT);
                        accepted.add(n);
                    }
                }
                for (var e : consumer.commitSync().entrySet()) {
                    if (e.getValue().isPresent()) {
                        emit(line("error", "commitSync " + e.getKey() + ": " + errorName(e.getValue().get())));
                        return;
                    }
                }
                if (System.currentTimeMillis() - last > 60_000) {
                    emit(line("error", "no record for 60 s: " + accepted.size() + " of " + count + " accepted"));
                    return;
                }
            }
        }
        emit(line("records", records, "accepted", accepted.size()));
    }

    /**
     * ShareFetch/ShareAcknowledge v2 (KIP-1206, KIP-1222): the Admin client sets the group's
     * share.record.lock.duration.ms to `lock_ms` (and share.auto.offset.reset=earliest), then
     * `count` records "job-N" are written to partition 0 and read by a KafkaShareConsumer with
     * share.acquire.mode=record_limit and max.poll.records=1, explicit acknowledgements: each
     * record is RENEWed on every poll until it was held `hold_ms` (several locks), then
     * ACCEPTed. Emits {"records": [[offset, deliveryCount, renewals, heldMs]], "lock_ms": the
     * consumer's acquisitionLockTimeoutMs} or {"error": ...}.
     */
    static void shareRenew(Map<String, String> a) throws Exception {
        String topic = a.get("topic");
        String group = a.get("group");
        int count = Integer.parseInt(a.get("count"));
        long holdMs = Long.parseLong(a.get("hold_ms"));
        Properties ap = new Properties();
        ap.put("bootstrap.servers", a.get("bootstrap"));
        try (Admin admin = Admin.create(ap)) {
            ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, group);
            admin.incrementalAlterConfigs(Map.of(resource, List.of(
                new AlterConfigOp(new ConfigEntry("share.record.lock.duration.ms", a.get("lock_ms")),
                                  AlterConfigOp.OpType.SET),
                new AlterConfigOp(new ConfigEntry("share.auto.offset.reset", "earliest"),
                                  AlterConfigOp.OpType.SET)))).all().get();
        }
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(producerProps(a))) {
            for (int i = 0; i < count; i++) producer.send(new ProducerRecord<>(topic, 0, null, "job-" + i));
            producer.flush();
        }
        Properties c = new Properties();
        c.put("bootstrap.servers", a.get("bootstrap"));
        c.put("group.id", group);
        c.put("key.deserializer", StringDeserializer.class.getName());
        c.put("value.deserializer", StringDeserializer.class.getName());
        c.put("share.acknowledgement.mode", "explicit");
        c.put("share.acquire.mode", "record_limit");
        c.put("max.poll.records", "1");
        List<List<Long>> records = new ArrayList<>();
        Map<Long, long[]> holding = new HashMap<>();  // offset -> {first seen ms, renewals}
        Set<Long> accepted = new HashSet<>();
        Integer lockMs = null;
        try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(c)) {
            consumer.subscribe(List.of(topic));
            long last = System.currentTimeMillis();
            while (accepted.size() < count) {
                ConsumerRecords<String, String> polled = consumer.poll(Duration.ofMillis(200));
                if (polled.count() > 1) {
                    emit(line("error", "record_limit with max.poll.records=1 returned " + polled.count()));
                    return;
                }
                if (consumer.acquisitionLockTimeoutMs().isPresent()) lockMs = consumer.acquisitionLockTimeoutMs().get();
                for (ConsumerRecord<String, String> r : polled) {
                    long now = System.currentTimeMillis();
                    last = now;
                    long[] held = holding.computeIfAbsent(r.offset(), o -> new long[] {now, 0});
                    int delivery = r.deliveryCount().map(Short::intValue).orElse(-1);
                    if (now - held[0] < holdMs) {
                        held[1]++;
                        consumer.acknowledge(r, AcknowledgeType.RENEW);
                    } else {
                        consumer.acknowledge(r, AcknowledgeType.ACCEPT);
                        if (accepted.add(r.offset())) {
                            records.add(List.of(r.offset(), (long) delivery, held[1], now - held[0]));
                        }
                    }
                    if (delivery != 1) {
                        emit(line("error", "offset " + r.offset() + " delivered " + delivery + " times"));
                        return;
                    }
                }
                for (var e : consumer.commitSync().entrySet()) {
                    if (e.getValue().isPresent()) {
                        emit(line("error", "commitSync " + e.getKey() + ": " + errorName(e.getValue().get())));
                        return;
                    }
                }
                if (System.currentTimeMillis() - last > 60_000) {
                    emit(line("error", "no record for 60 s: " + accepted.size() + " of " + count + " accepted"));
                    return;
                }
            }
        }
        emit(line("records", records, "lock_ms", lockMs));
    }

    /**
     * KafkaShareConsumers driven step by step from pytest (tests/kafka/
     * test_share_consumer_differential.py), so one sequence is written once and played with
     * this client and with librdkafka's. A command per stdin line, an answer per stdout line:
     *   {"op": "open", "id": C, "group": G, "topic": T, "explicit": bool}      -> {}
     *   {"op": "poll", "id": C, "ms": N}  -> {"records": [[partition, offset, key, value, deliveryCount]]}
     *   {"op": "ack", "id": C, "partition": P, "offset": O, "type": "ACCEPT|RELEASE|REJECT"}  -> {}
     *       (a record of C's last poll)
     *   {"op": "commit", "id": C}         -> {"result": {partition: null | error name}}
     *   {"op": "close", "id": C}          -> {}
     *   {"op": "exit"}
     * A call that throws answers {"error": name} (Kafka's error name where the exception has one).
     */
    static void shareScript(Map<String, String> a) throws Exception {
        Map<String, KafkaShareConsumer<String, String>> consumers = new HashMap<>();
        Map<String, Map<List<Long>, ConsumerRecord<String, String>>> polled = new HashMap<>();
        java.io.BufferedReader in = new java.io.BufferedReader(new java.io.InputStreamReader(System.in));
        try {
            for (String text = in.readLine(); text != null; text = in.readLine()) {
                @SuppressWarnings("unchecked")
                Map<String, Object> cmd = JSON.readValue(text, Map.class);
                String op = (String) cmd.get("op");
                if (op.equals("exit")) break;
                String id = (String) cmd.get("id");
                try {
                    switch (op) {
                        case "open" -> {
                            Properties c = new Properties();
                            c.put("bootstrap.servers", a.get("bootstrap"));
                            c.put("group.id", cmd.get("group"));
                            c.put("key.deserializer", StringDeserializer.class.getName());
                            c.put("value.deserializer", StringDeserializer.class.getName());
                            c.put("share.acknowledgement.mode",
                                  Boolean.TRUE.equals(cmd.get("explicit")) ? "explicit" : "implicit");
                            KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(c);
                            consumer.subscribe(List.of((String) cmd.get("topic")));
                            consumers.put(id, consumer);
                            emit(line());
                        }
                        case "poll" -> {
                            List<List<Object>> out = new ArrayList<>();
                            Map<List<Long>, ConsumerRecord<String, String>> last = new HashMap<>();
                            for (ConsumerRecord<String, String> r : consumers.get(id).poll(
                                    Duration.ofMillis(((Number) cmd.get("ms")).longValue()))) {
                                out.add(java.util.Arrays.asList(r.partition(), r.offset(), r.key(), r.value(),
                                        r.deliveryCount().map(Short::intValue).orElse(-1)));
                                last.put(List.of((long) r.partition(), r.offset()), r);
                            }
                            polled.put(id, last);
                            emit(line("records", out));
                        }
                        case "ack" -> {
                            ConsumerRecord<String, String> r = polled.get(id).get(List.of(
                                ((Number) cmd.get("partition")).longValue(), ((Number) cmd.get("offset")).longValue()));
                            consumers.get(id).acknowledge(r, AcknowledgeType.valueOf((String) cmd.get("type")));
                            emit(line());
                        }
                        case "commit" -> {
                            Map<String, Object> result = new TreeMap<>();
                            for (var e : consumers.get(id).commitSync().entrySet()) {
                                result.put(String.valueOf(e.getKey().partition()),
                                           e.getValue().map(JavaClients::kafkaErrorName).orElse(null));
                            }
                            emit(line("result", result));
                        }
                        case "close" -> {
                            consumers.remove(id).close();
                            polled.remove(id);
                            emit(line());
                        }
                        default -> throw new IllegalArgumentException("unknown op " + op);
                    }
                } catch (Exception e) {
                    emit(line("error", kafkaErrorName(e)));
                }
            }
        } finally {
            for (KafkaShareConsumer<String, String> c : consumers.values()) c.close(Duration.ofSeconds(5));
        }
    }

    /** Kafka's name of the error an exception stands for (INVALID_RECORD_STATE), else its class. */
    static String kafkaErrorName(Throwable e) {
        org.apache.kafka.common.protocol.Errors error = org.apache.kafka.common.protocol.Errors.forException(e);
        return error == org.apache.kafka.common.protocol.Errors.UNKNOWN_SERVER_ERROR ? errorName(e) : error.name();
    }

    static Properties producerProps(Map<String, String> a) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, 60_000);
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, 15_000);
        return p;
    }

    // ------------------------------------------------------------------ idempotent producer

    /** N records, value "v<i>" to partition i % P; every acknowledgement with its offset. */
    static void idempotent(Map<String, String> a) throws Exception {
        String topic = a.get("topic");
        int count = Integer.parseInt(a.get("count"));
        int partitions = Integer.parseInt(a.get("partitions"));
        Properties p = producerProps(a);
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, 5);
        p.put(ProducerConfig.LINGER_MS_CONFIG, 2);
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, 2048);  // many batches in flight per partition
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, a.getOrDefault("compression", "none"));
        List<long[]> acks = new ArrayList<>();
        Map<String, Integer> errors = new TreeMap<>();
        AtomicInteger callbacks = new AtomicInteger();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            for (int i = 0; i < count; i++) {
                final int n = i;
                producer.send(new ProducerRecord<>(topic, i % partitions, "k" + i, "v" + i), (md, e) -> {
                    callbacks.incrementAndGet();
                    synchronized (acks) {
                        if (e != null) errors.merge(errorName(e), 1, Integer::sum);
                        else acks.add(new long[] {n, md.partition(), md.offset()});
                    }
                });
            }
            producer.flush();
        }
        emit(line("acks", acks, "errors", errors, "callbacks", callbacks.get()));
    }

    // ------------------------------------------------------------------ fetch sessions

    /**
     * One consumer, partitions assigned by hand, in three phases (KIP-227 fetch sessions: the
     * partitions the consumer fetches change between phases): (1) every partition of
     * `first` from the beginning until first_count records were read; (2) `second`'s added,
     * until second_count more; (3) only `first`'s partitions below `keep` and `second` stay,
     * then L "late" records go to every partition of `first` (the i-th to i mod P) and the
     * consumer reads until it has those of the partitions it kept, then polls 2 s more.
     * Each phase's records as [partition, offset, value] in one JSON line.
     */
    static void sessions(Map<String, String> a) throws Exception {
        String first = a.get("first");
        String second = a.get("second");
        int firstPartitions = Integer.parseInt(a.get("first_partitions"));
        int secondPartitions = Integer.parseInt(a.get("second_partitions"));
        int keep = Integer.parseInt(a.get("keep"));
        int late = Integer.parseInt(a.get("late"));
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        p.put(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG, 4096);  // many fetches per phase
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, 100);  // and many idle ones
        List<TopicPartition> firstAll = new ArrayList<>();
        for (int i = 0; i < firstPartitions; i++) firstAll.add(new TopicPartition(first, i));
        List<TopicPartition> secondAll = new ArrayList<>();
        for (int i = 0; i < secondPartitions; i++) secondAll.add(new TopicPartition(second, i));
        long lateKept = java.util.stream.IntStream.range(0, late).filter(i -> i % firstPartitions < keep).count();
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(p)) {
            c.assign(firstAll);
            c.seekToBeginning(firstAll);
            emit(line("phase", 1, "records", readAtLeast(c, Long.parseLong(a.get("first_count")), 0)));
            List<TopicPartition> both = new ArrayList<>(firstAll);
            both.addAll(secondAll);
            c.assign(both);
            c.seekToBeginning(secondAll);
            emit(line("phase", 2, "records", readAtLeast(c, Long.parseLong(a.get("second_count")), 0)));
            List<TopicPartition> kept = new ArrayList<>(firstAll.subList(0, keep));
            kept.addAll(secondAll);
            c.assign(kept);
            c.poll(Duration.ofMillis(500));  // a fetch with the removed partitions forgotten
            try (KafkaProducer<String, String> producer = new KafkaProducer<>(producerProps(a))) {
                sendAll(producer, first, firstPartitions, "late", late);
            }
            emit(line("phase", 3, "records", readAtLeast(c, lateKept, 2000)));
        }
    }

    /**
     * The scale benchmark's Java row (tests/perf/test_scale.py): `records` values of 100 bytes,
     * record i to topic prefix-(i mod T) (4 digits), partition (i / T) mod P, acks=1,
     * linger.ms=5; then a KafkaConsumer (fetch sessions, KIP-227) assigned every partition
     * reads them back from the end offsets before them. Emits {"produce_s": seconds until all acknowledged,
     * "consume_s": seconds from assign to the last record, "fetches": fetch requests sent}.
     */
    static void spread(Map<String, String> a) throws Exception {
        String prefix = a.get("prefix");
        int topics = Integer.parseInt(a.get("topics"));
        int partitions = Integer.parseInt(a.get("partitions"));
        int records = Integer.parseInt(a.get("records"));
        String[] names = new String[topics];
        for (int t = 0; t < topics; t++) names[t] = String.format("%s-%04d", prefix, t);
        Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
        pp.put(ProducerConfig.ACKS_CONFIG, "1");
        pp.put(ProducerConfig.LINGER_MS_CONFIG, 5);
        pp.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, false);  // acks=1, as librdkafka's row
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, org.apache.kafka.common.serialization.ByteArraySerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, org.apache.kafka.common.serialization.ByteArraySerializer.class.getName());
        byte[] value = new byte[100];
        java.util.Arrays.fill(value, (byte) 'x');
        Properties cp = new Properties();
        cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
        cp.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        cp.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 10_000);
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, org.apache.kafka.common.serialization.ByteArrayDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, org.apache.kafka.common.serialization.ByteArrayDeserializer.class.getName());
        List<TopicPartition> all = new ArrayList<>();
        for (String name : names) for (int q = 0; q < partitions; q++) all.add(new TopicPartition(name, q));
        Map<TopicPartition, Long> starts;
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(cp)) {
            starts = c.endOffsets(all, Duration.ofSeconds(300));  // the records before this run's
        }
        AtomicInteger failed = new AtomicInteger();
        double produceS;
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pp)) {
            for (String name : names) producer.partitionsFor(name);  // metadata before the clock
            long t0 = System.nanoTime();
            for (int i = 0; i < records; i++) {
                producer.send(new ProducerRecord<>(names[i % topics], (i / topics) % partitions, null, value),
                        (md, e) -> { if (e != null) failed.incrementAndGet(); });
            }
            producer.flush();
            produceS = (System.nanoTime() - t0) / 1e9;
        }
        if (failed.get() > 0) throw new IllegalStateException(failed.get() + " sends failed");
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(cp)) {
            for (String name : names) c.partitionsFor(name);
            long t0 = System.nanoTime();
            c.assign(all);
            for (TopicPartition tp : all) c.seek(tp, starts.get(tp));
            long got = 0;
            long last = System.nanoTime();
            while (got < records) {
                int n = c.poll(Duration.ofMillis(1000)).count();
                if (n > 0) last = System.nanoTime();
                else if (System.nanoTime() - last > 120_000_000_000L) {
                    throw new IllegalStateException("consumed " + got + " of " + records);
                }
                got += n;
            }
            double consumeS = (System.nanoTime() - t0) / 1e9;
            double fetches = 0;
            for (var m : c.metrics().entrySet()) {
                if (m.getKey().name().equals("fetch-total") && m.getKey().group().equals("consumer-fetch-manager-metrics")) {
                    fetches = ((Number) m.getValue().metricValue()).doubleValue();
                }
            }
            emit(line("produce_s", produceS, "consume_s", consumeS, "records", got, "fetches", fetches));
        }
    }

    /** Poll until `count` records were read (60 s at most), then `extraMs` more. */
    static List<long[]> readAtLeast(KafkaConsumer<String, String> c, long count, long extraMs) {
        List<long[]> out = new ArrayList<>();
        long deadline = System.currentTimeMillis() + 60_000;
        while (out.size() < count && System.currentTimeMillis() < deadline) {
            for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                out.add(new long[] {r.partition(), r.offset(), Long.parseLong(r.value().replaceAll("[^0-9]", ""))});
            }
        }
        long until = System.currentTimeMillis() + extraMs;
        while (System.currentTimeMillis() < until) {
            for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                out.add(new long[] {r.partition(), r.offset(), Long.parseLong(r.value().replaceAll("[^0-9]", ""))});
            }
        }
        return out;
    }

    // ------------------------------------------------------------------ transactional producer

    static List<long[]> sendAll(KafkaProducer<String, String> producer, String topic, int partitions,
                                String prefix, int count) throws Exception {
        List<java.util.concurrent.Future<RecordMetadata>> futures = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            futures.add(producer.send(new ProducerRecord<>(topic, i % partitions, prefix + i, prefix + i)));
        }
        producer.flush();
        List<long[]> out = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            RecordMetadata md = futures.get(i).get();
            out.add(new long[] {i, md.partition(), md.offset()});
        }
        return out;
    }

    /**
     * Transaction "c" committed, "a" aborted, "o" committed with the group's offsets sent to
     * it (offset 42 on partition 0 of the topic); then a second producer with the same
     * transactional id fences the first in the middle of transaction "f".
     */
    static void transactional(Map<String, String> a) throws Exception {
        String topic = a.get("topic");
        int partitions = Integer.parseInt(a.get("partitions"));
        Properties p = producerProps(a);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, a.get("txn"));
        p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, 60_000);
        KafkaProducer<String, String> first = new KafkaProducer<>(p);
        first.initTransactions();
        first.beginTransaction();
        List<long[]> committed = sendAll(first, topic, partitions, "c", 6);
        first.commitTransaction();
        first.beginTransaction();
        List<long[]> aborted = sendAll(first, topic, partitions, "a", 6);
        first.abortTransaction();
        first.beginTransaction();
        List<long[]> withOffsets = sendAll(first, topic, partitions, "o", 6);
        first.sendOffsetsToTransaction(Map.of(new TopicPartition(topic, 0), new OffsetAndMetadata(42, "meta")),
                                       new ConsumerGroupMetadata(a.get("group")));
        first.commitTransaction();
        emit(line("committed", committed, "aborted", aborted, "with_offsets", withOffsets));

        first.beginTransaction();
        List<long[]> fenced = sendAll(first, topic, partitions, "f", 3);
        KafkaProducer<String, String> second = new KafkaProducer<>(p);
        second.initTransactions();  // fences `first` and aborts its open transaction
        Object sendAfter = attempt(() -> {
            first.send(new ProducerRecord<>(topic, 0, "late", "late")).get();
            return "sent";
        });
        Object commitAfter = attempt(() -> {
            first.commitTransaction();
            return "committed";
        });
        first.close(Duration.ofSeconds(5));
        second.beginTransaction();
        List<long[]> after = sendAll(second, topic, partitions, "s", 3);
        second.commitTransaction();
        second.close();
        emit(line("fenced_records", fenced, "send_after_fence", sendAfter, "commit_after_fence", commitAfter,
                  "second", after));
    }

    // ------------------------------------------------------------------ consumer group

    /**
     * Two consumers of one group in two threads. Partitions stay paused until the group has
     * split the topic between them (both own some, together all, none twice); then they read
     * until `count` records are consumed, committing synchronously after every poll.
     */
    static void group(Map<String, String> a) throws Exception {
        String topic = a.get("topic");
        int count = Integer.parseInt(a.get("count"));
        int partitions = Integer.parseInt(a.get("partitions"));
        int members = 2;
        Map<Integer, Set<TopicPartition>> owned = new ConcurrentHashMap<>();
        AtomicBoolean split = new AtomicBoolean();
        AtomicInteger consumed = new AtomicInteger();
        AtomicBoolean done = new AtomicBoolean();
        List<Thread> threads = new ArrayList<>();
        List<Map<String, Object>> results = new ArrayList<>();
        long deadline = System.currentTimeMillis() + 90_000;
        for (int m = 0; m < members; m++) {
            final int member = m;
            owned.put(member, ConcurrentHashMap.newKeySet());
            Properties p = new Properties();
            p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
            p.put(ConsumerConfig.GROUP_ID_CONFIG, a.get("group"));
            p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, a.get("protocol"));
            p.put(ConsumerConfig.CLIENT_ID_CONFIG, "member-" + member);
            p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
            p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
            p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 50);
            if (a.get("protocol").equals("classic")) p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, 500);
            Thread t = new Thread(() -> {
                List<long[]> records = new ArrayList<>();
                Map<String, Object> result = line("member", member, "records", records);
                try (KafkaConsumer<String, String> c = new KafkaConsumer<>(p)) {
                    c.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                        public void onPartitionsRevoked(Collection<TopicPartition> parts) {
                            owned.get(member).removeAll(parts);
                        }

                        public void onPartitionsAssigned(Collection<TopicPartition> parts) {
                            owned.get(member).addAll(parts);
                            if (!split.get()) c.pause(parts);
                        }
                    });
                    boolean resumed = false;
                    while (!done.get()) {
                        if (System.currentTimeMillis() > deadline) {
                            result.put("error", "deadline: consumed " + consumed.get() + " of " + count
                                                + ", owned " + owned);
                            break;
                        }
                        if (split.get() && !resumed) {
                            c.resume(c.paused());
                            resumed = true;
                            result.put("assignment", owned.get(member).stream().map(TopicPartition::partition)
                                                          .sorted().toList());
                        }
                        var polled = c.poll(Duration.ofMillis(200));
                        for (ConsumerRecord<String, String> r : polled) {
                            records.add(new long[] {r.partition(), r.offset(), Long.parseLong(r.value().substring(1))});
                        }
                        if (!polled.isEmpty()) {
                            c.commitSync();
                            if (consumed.addAndGet(polled.count()) >= count) done.set(true);
                        }
                        if (!split.get()) {
                            Set<TopicPartition> all = new HashSet<>();
                            int total = 0;
                            boolean everyoneOwns = true;
                            for (Set<TopicPartition> s : owned.values()) {
                                all.addAll(s);
                                total += s.size();
                                everyoneOwns &= !s.isEmpty();
                            }
                            if (everyoneOwns && all.size() == partitions && total == partitions) split.set(true);
                        }
                    }
                    // The partitions this member owned at the split: at the end the other member's
                    // close may have revoked them in this one's last poll (owned then empty).
                    Set<TopicPartition> mine = new HashSet<>();
                    @SuppressWarnings("unchecked")
                    List<Integer> split_assignment = (List<Integer>) result.getOrDefault("assignment", List.of());
                    for (int q : split_assignment) mine.add(new TopicPartition(topic, q));
                    result.put("committed", c.committed(mine).entrySet().stream().collect(
                        java.util.stream.Collectors.toMap(e -> e.getKey().partition(),
                                                          e -> e.getValue() == null ? -1 : e.getValue().offset())));
                    result.put("group_metadata_generation", c.groupMetadata().generationId());
                } catch (Exception e) {
                    result.put("error", errorName(e) + ": " + e.getMessage());
                    done.set(true);
                }
                synchronized (results) {
                    results.add(result);
                }
            }, "member-" + m);
            threads.add(t);
            t.start();
        }
        for (Thread t : threads) t.join();
        for (Map<String, Object> r : results) emit(r);
    }

    // ------------------------------------------------------------------ admin

    static Map<String, Object> node(Node n) {
        return n == null ? null : line("id", n.id(), "rack", n.rack());
    }

    static Object topicDescription(TopicDescription d) {
        List<Object> parts = new ArrayList<>();
        for (TopicPartitionInfo p : d.partitions()) {
            parts.add(line("partition", p.partition(), "leader", p.leader() == null ? -1 : p.leader().id(),
                           "replicas", p.replicas().stream().map(Node::id).toList(),
                           "isr", p.isr().stream().map(Node::id).toList()));
        }
        return line("name", d.name(), "internal", d.isInternal(), "has_topic_id", !d.topicId().toString().isEmpty()
                    && d.topicId().getMostSignificantBits() != 0, "partitions", parts);
    }

    static Object offsets(Admin admin, Map<TopicPartition, OffsetSpec> specs, IsolationLevel isolation)
            throws Exception {
        Map<String, Object> out = new TreeMap<>();
        for (var e : admin.listOffsets(specs, new ListOffsetsOptions(isolation)).all().get().entrySet()) {
            ListOffsetsResultInfo info = e.getValue();
            out.put(e.getKey().toString(), line("offset", info.offset(), "timestamp", info.timestamp(),
                                                "leader_epoch", info.leaderEpoch().orElse(-1)));
        }
        return out;
    }

    /** Each spec's answer for `tp`; timestamps (not -1) relative to `base`. */
    static Object offsetsPerSpec(Admin admin, TopicPartition tp, Map<String, OffsetSpec> specs, long base) {
        Map<String, Object> out = new LinkedHashMap<>();
        for (var e : specs.entrySet()) {
            out.put(e.getKey(), attempt(() -> {
                ListOffsetsResultInfo info = admin.listOffsets(Map.of(tp, e.getValue())).partitionResult(tp).get();
                return line("offset", info.offset(), "timestamp", info.timestamp() < 0 ? info.timestamp()
                                                                   : info.timestamp() - base);
            }));
        }
        return out;
    }

    static Object configs(Admin admin, ConfigResource resource, Set<String> names) throws Exception {
        Config config = admin.describeConfigs(List.of(resource)).all().get().get(resource);
        Map<String, Object> out = new TreeMap<>();
        for (ConfigEntry e : config.entries()) {
            if (!names.contains(e.name())) continue;
            out.put(e.name(), line("value", e.value(), "source", e.source().toString(), "default", e.isDefault(),
                                   "sensitive", e.isSensitive(), "read_only", e.isReadOnly(),
                                   "type", e.type().toString(),
                                   "synonyms", e.synonyms().stream().map(s -> s.source().toString()).toList()));
        }
        out.put("_count", config.entries().size());
        return out;
    }

    static Object group(ConsumerGroupDescription g) {
        List<Object> members = new ArrayList<>();
        for (MemberDescription m : g.members()) {
            members.add(line("client_id", m.clientId(), "has_member_id", !m.consumerId().isEmpty(),
                             "instance_id", m.groupInstanceId().orElse(null),
                             "assignment", m.assignment().topicPartitions().stream().map(TopicPartition::toString)
                                            .sorted().toList(),
                             "target_assignment", m.targetAssignment().map(t -> t.topicPartitions().stream()
                                 .map(TopicPartition::toString).sorted().toList()).orElse(null),
                             "has_member_epoch", m.memberEpoch().isPresent()));
        }
        return line("group_id", g.groupId(), "simple", g.isSimpleConsumerGroup(), "type", g.type().toString(),
                    "state", g.groupState().toString(), "assignor", g.partitionAssignor(),
                    "coordinator_known", g.coordinator() != null && g.coordinator().id() >= 0,
                    "has_group_epoch", g.groupEpoch().isPresent(), "members", members);
    }

    static Object describeGroup(Admin admin, String id) {
        return attempt(() -> group(admin.describeConsumerGroups(List.of(id)).all().get().get(id)));
    }

    /** Wait (bounded) until `ready` holds for the description of group `id`. */
    static void awaitGroup(Admin admin, String id, java.util.function.Predicate<ConsumerGroupDescription> ready)
            throws Exception {
        long deadline = System.currentTimeMillis() + 30_000;
        while (true) {
            ConsumerGroupDescription g = admin.describeConsumerGroups(List.of(id)).all().get().get(id);
            if (ready.test(g)) return;
            if (System.currentTimeMillis() > deadline) throw new IllegalStateException("group " + id + ": " + g);
            Thread.sleep(100);
        }
    }

    /**
     * The Admin calls in one sequence, each result normalized (no ids, ports, times) so a run
     * against dcmirror compares with a run against Kafka. Records are produced (with fixed
     * timestamps) by a Java producer; groups are made by Java consumers.
     */
    static void admin(Map<String, String> a) throws Exception {
        String prefix = a.get("prefix");
        String topic = prefix + "-topic";
        Properties props = new Properties();
        props.put("bootstrap.servers", a.get("bootstrap"));
        props.put("default.api.timeout.ms", 30_000);
        try (Admin admin = Admin.create(props)) {
            // createTopics: a new topic with a config, the same again, bad arguments
            Map<String, Object> created = new LinkedHashMap<>();
            created.put("new", attempt(() -> {
                var r = admin.createTopics(List.of(new NewTopic(topic, 3, (short) 1)
                    .configs(Map.of("retention.ms", "3600000", "cleanup.policy", "delete"))));
                return line("partitions", r.numPartitions(topic).get(), "replication_factor",
                            r.replicationFactor(topic).get(), "config_retention_ms",
                            r.config(topic).get().get("retention.ms").value());
            }));
            created.put("exists", attempt(() -> admin.createTopics(List.of(new NewTopic(topic, 3, (short) 1))).all().get()));
            created.put("zero_partitions", attempt(() -> admin.createTopics(
                List.of(new NewTopic(prefix + "-zero", 0, (short) 1))).all().get()));
            created.put("replication_too_large", attempt(() -> admin.createTopics(
                List.of(new NewTopic(prefix + "-rf", 1, (short) 5))).all().get()));
            created.put("bad_config", attempt(() -> admin.createTopics(List.of(new NewTopic(prefix + "-cfg", 1, (short) 1)
                .configs(Map.of("retention.ms", "soon")))).all().get()));
            created.put("unknown_config", attempt(() -> admin.createTopics(List.of(new NewTopic(prefix + "-unk", 1, (short) 1)
                .configs(Map.of("no.such.config", "1")))).all().get()));
            created.put("bad_name", attempt(() -> admin.createTopics(
                List.of(new NewTopic("bad name!", 1, (short) 1))).all().get()));
            emit(line("call", "createTopics", "result", created));

            // describeTopics (and an unknown topic), describeCluster
            Map<String, Object> described = new LinkedHashMap<>();
            described.put("topic", attempt(() -> topicDescription(
                admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic))));
            described.put("unknown", attempt(() -> admin.describeTopics(List.of(prefix + "-missing")).allTopicNames().get()));
            emit(line("call", "describeTopics", "result", described));
            DescribeClusterResult cluster = admin.describeCluster();
            Collection<Node> nodes = cluster.nodes().get();
            Node controller = cluster.controller().get();
            emit(line("call", "describeCluster", "result", line(
                "nodes", nodes.stream().map(JavaClients::node).toList(),
                "controller_is_a_node", controller != null && nodes.stream().anyMatch(n -> n.id() == controller.id()),
                "has_cluster_id", cluster.clusterId().get() != null && !cluster.clusterId().get().isEmpty())));

            // records with known timestamps: partition 0 gets 10 records at base + 1000, 2000,
            // ... 10000 (a minute ago: within every retention, so no retention pass runs into
            // the test); timestamps are reported relative to base
            long base = (System.currentTimeMillis() / 1000 - 60) * 1000;
            Properties pp = producerProps(a);
            pp.put(ProducerConfig.ACKS_CONFIG, "all");
            try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp)) {
                for (int i = 0; i < 10; i++) {
                    producer.send(new ProducerRecord<>(topic, 0, base + 1000L * (i + 1), "k" + i, "v" + i)).get();
                }
                producer.send(new ProducerRecord<>(topic, 1, base + 500L, "k", "v")).get();
            }
            TopicPartition p0 = new TopicPartition(topic, 0);
            TopicPartition p1 = new TopicPartition(topic, 1);
            TopicPartition p2 = new TopicPartition(topic, 2);
            Map<String, OffsetSpec> specs = new LinkedHashMap<>();
            specs.put("earliest", OffsetSpec.earliest());
            specs.put("latest", OffsetSpec.latest());
            specs.put("at_3500", OffsetSpec.forTimestamp(base + 3500));
            specs.put("at_10000", OffsetSpec.forTimestamp(base + 10000));
            specs.put("after_last", OffsetSpec.forTimestamp(base + 20000));
            specs.put("max_timestamp", OffsetSpec.maxTimestamp());
            emit(line("call", "listOffsets", "result", line(
                "p0", offsetsPerSpec(admin, p0, specs, base),
                "all_latest", offsets(admin, Map.of(p0, OffsetSpec.latest(), p1, OffsetSpec.latest(),
                                                    p2, OffsetSpec.latest()), IsolationLevel.READ_COMMITTED))));

            // describeConfigs, incrementalAlterConfigs (SET, APPEND, DELETE, a bad value)
            ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
            Set<String> names = Set.of("retention.ms", "cleanup.policy", "segment.bytes", "min.insync.replicas",
                                       "max.message.bytes", "compression.type");
            Map<String, Object> cfg = new LinkedHashMap<>();
            cfg.put("created", configs(admin, resource, names));
            cfg.put("set", attempt(() -> admin.incrementalAlterConfigs(Map.of(resource, List.of(
                new AlterConfigOp(new ConfigEntry("segment.bytes", "1048576"), AlterConfigOp.OpType.SET),
                new AlterConfigOp(new ConfigEntry("cleanup.policy", "compact"), AlterConfigOp.OpType.APPEND),
                new AlterConfigOp(new ConfigEntry("retention.ms", null), AlterConfigOp.OpType.DELETE)))).all().get()));
            cfg.put("altered", configs(admin, resource, names));
            cfg.put("bad_value", attempt(() -> admin.incrementalAlterConfigs(Map.of(resource, List.of(
                new AlterConfigOp(new ConfigEntry("min.insync.replicas", "many"), AlterConfigOp.OpType.SET)))).all().get()));
            cfg.put("unknown_topic", attempt(() -> admin.describeConfigs(List.of(
                new ConfigResource(ConfigResource.Type.TOPIC, prefix + "-missing"))).all().get()));
            ConfigResource broker = new ConfigResource(ConfigResource.Type.BROKER, "1");
            cfg.put("broker", configs(admin, broker, Set.of("log.retention.hours", "log.segment.bytes",
                                                             "log.cleanup.policy", "message.max.bytes")));
            emit(line("call", "configs", "result", cfg));

            // describeConsumerGroups: a classic and a KIP-848 group, each while its member
            // runs and after it left; an unknown group
            Map<String, Object> groups = new LinkedHashMap<>();
            for (String protocol : List.of("classic", "consumer")) {
                String id = prefix + "-" + protocol;
                Properties cp = new Properties();
                cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
                cp.put(ConsumerConfig.GROUP_ID_CONFIG, id);
                cp.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
                cp.put(ConsumerConfig.CLIENT_ID_CONFIG, "admin-test-" + protocol);
                cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
                cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
                cp.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
                try (KafkaConsumer<String, String> c = new KafkaConsumer<>(cp)) {
                    c.subscribe(List.of(topic));
                    long deadline = System.currentTimeMillis() + 30_000;
                    while (c.assignment().size() < 3 && System.currentTimeMillis() < deadline) c.poll(Duration.ofMillis(100));
                    c.commitSync(Map.of(p0, new OffsetAndMetadata(4)));
                    awaitGroup(admin, id, g -> g.groupState().toString().equals("Stable")
                                               && g.members().size() == 1
                                               && g.members().iterator().next().assignment().topicPartitions().size() == 3);
                    groups.put(protocol + "_running", describeGroup(admin, id));
                    groups.put(protocol + "_offsets", attempt(() -> new TreeMap<>(admin.listConsumerGroupOffsets(id)
                        .partitionsToOffsetAndMetadata().get().entrySet().stream().collect(java.util.stream.Collectors.toMap(
                            e -> e.getKey().toString(), e -> e.getValue().offset())))));
                }
                awaitGroup(admin, id, g -> g.members().isEmpty());
                groups.put(protocol + "_left", describeGroup(admin, id));
            }
            groups.put("unknown", describeGroup(admin, prefix + "-nobody"));
            emit(line("call", "describeConsumerGroups", "result", groups));

            // deleteRecords: below the end, at the end, beyond it
            Map<String, Object> deleted = new LinkedHashMap<>();
            deleted.put("to_4", attempt(() -> admin.deleteRecords(Map.of(p0, RecordsToDelete.beforeOffset(4)))
                .lowWatermarks().get(p0).get().lowWatermark()));
            deleted.put("earliest_after", offsetsPerSpec(admin, p0, Map.of("earliest", OffsetSpec.earliest()), base));
            deleted.put("to_end", attempt(() -> admin.deleteRecords(Map.of(p1, RecordsToDelete.beforeOffset(-1)))
                .lowWatermarks().get(p1).get().lowWatermark()));
            deleted.put("beyond_end", attempt(() -> admin.deleteRecords(Map.of(p2, RecordsToDelete.beforeOffset(5)))
                .lowWatermarks().get(p2).get().lowWatermark()));
            deleted.put("below_start", attempt(() -> admin.deleteRecords(Map.of(p0, RecordsToDelete.beforeOffset(2)))
                .lowWatermarks().get(p0).get().lowWatermark()));
            emit(line("call", "deleteRecords", "result", deleted));
        }
    }
}
