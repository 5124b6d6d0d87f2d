/* test_header_layout.h - the sizes, offsets and constants of ibmsg.h that must be the same in C
 * and C++, as initializers { "name", value } of an array of { const char *, size_t }: included
 * inside that array by test_header.c (compiled as C99) and by test_header_cxx.cpp (as C++17), so
 * that each language computes every value itself, under the same spelling of its name. */
#define SIZE(t) {"sizeof(" #t ")", sizeof(t)},
#define OFF(t, m) {"offsetof(" #t ", " #m ")", offsetof(t, m)},
#define VAL(c) {#c, (size_t)(c)},
#define ERR(name, value, text) VAL(IBMSG_##name)
    SIZE(ibmsg_buffer) OFF(ibmsg_buffer, data) OFF(ibmsg_buffer, size) OFF(ibmsg_buffer, status)
    OFF(ibmsg_buffer, user_data) OFF(ibmsg_buffer, impl) OFF(ibmsg_buffer, reserved)
    SIZE(ibmsg_socket) OFF(ibmsg_socket, status) OFF(ibmsg_socket, user_data)
    OFF(ibmsg_socket, loop) OFF(ibmsg_socket, close_reason) OFF(ibmsg_socket, reject_reason)
    OFF(ibmsg_socket, impl) OFF(ibmsg_socket, reserved)
    SIZE(ibmsg_event_loop) OFF(ibmsg_event_loop, connection_request)
    OFF(ibmsg_event_loop, connection_established) OFF(ibmsg_event_loop, message_received)
    OFF(ibmsg_event_loop, message_sent) OFF(ibmsg_event_loop, connection_closed)
    OFF(ibmsg_event_loop, user_data) OFF(ibmsg_event_loop, impl)
    OFF(ibmsg_event_loop, write_received) OFF(ibmsg_event_loop, message_incoming)
    OFF(ibmsg_event_loop, reserved)
    SIZE(ibmsg_incoming) OFF(ibmsg_incoming, size) OFF(ibmsg_incoming, imm)
    OFF(ibmsg_incoming, flags) OFF(ibmsg_incoming, impl) OFF(ibmsg_incoming, request)
    OFF(ibmsg_incoming, reserved)
    SIZE(ibmsg_memory) OFF(ibmsg_memory, buffers) OFF(ibmsg_memory, shared)
    OFF(ibmsg_memory, large) OFF(ibmsg_memory, reserved)
    SIZE(ibmsg_loop_counters) OFF(ibmsg_loop_counters, remote_access_violations)
    OFF(ibmsg_loop_counters, requests_banned) OFF(ibmsg_loop_counters, reserved)
    VAL(IBMSG_ACCESS_DEVICE_WIDE)
    SIZE(ibmsg_connection_request) OFF(ibmsg_connection_request, status)
    OFF(ibmsg_connection_request, listener) OFF(ibmsg_connection_request, loop)
    OFF(ibmsg_connection_request, peer_address) OFF(ibmsg_connection_request, peer_port)
    OFF(ibmsg_connection_request, impl) OFF(ibmsg_connection_request, reserved)
    SIZE(enum ibmsg_error) SIZE(enum ibmsg_socket_status) SIZE(enum ibmsg_buffer_status)
    SIZE(enum ibmsg_request_status) SIZE(enum ibmsg_option)
    SIZE(ibmsg_connection_request_cb) SIZE(ibmsg_message_sent_cb)
    VAL(IBMSG_OK) IBMSG_ERRNO_MAP(ERR) IBMSG_ERROR_MAP(ERR)
    VAL(IBMSG_UNCONNECTED) VAL(IBMSG_ADDRESS_RESOLVED) VAL(IBMSG_ROUTE_RESOLVED)
    VAL(IBMSG_CONNECTED) VAL(IBMSG_DISCONNECTING) VAL(IBMSG_ERROR) VAL(IBMSG_LISTENING)
    VAL(IBMSG_WAITING) VAL(IBMSG_SENT) VAL(IBMSG_RECEIVED) VAL(IBMSG_SEND_FAILED) VAL(IBMSG_FREED)
    VAL(IBMSG_UNDECIDED) VAL(IBMSG_ACCEPTED) VAL(IBMSG_REJECTED)
    VAL(IBMSG_OPT_RECV_DEPTH) VAL(IBMSG_OPT_SEND_DEPTH) VAL(IBMSG_OPT_SEND_QUEUE)
    VAL(IBMSG_OPT_MAX_MSG_SIZE) VAL(IBMSG_OPT_CONNECT_TIMEOUT) VAL(IBMSG_OPT_RNR_RETRY)
    VAL(IBMSG_OPT_SOURCE_ADDR) VAL(IBMSG_OPT_DEVICE) VAL(IBMSG_OPT_EAGER_SIZE)
    VAL(IBMSG_OPT_SHARED_RECV) VAL(IBMSG_OPT_KEEPALIVE) VAL(IBMSG_OPT_KEEPALIVE_COUNT)
    VAL(IBMSG_OPT_ACK_TIMEOUT) VAL(IBMSG_OPT_RETRY_COUNT) VAL(IBMSG_LOG_ERROR) VAL(IBMSG_LOG_DEBUG)
    VAL(IBMSG_MSG_IMM) VAL(IBMSG_MSG_REGION)
    VAL(IBMSG_VERSION) VAL(IBMSG_ERRNO_MAX) VAL(IBMSG_EBASE)
#undef SIZE
#undef OFF
#undef VAL
#undef ERR
