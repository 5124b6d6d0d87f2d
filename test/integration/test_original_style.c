/* test_original_style.c - programs written the way the original (2015) ibmsg was used still
 * work: a receiver whose connection_request callback mallocs an ibmsg_socket and accepts, and a
 * sender that dispatches until connection.status / msg.status change. The two halves below use
 * only the original names; they run in two processes (fork) and in two threads with two loops.
 * The one new call is ibmsg_socket_local_address(), to learn the port the receiver picked. */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define MSGSIZE (4096)
#define MESSAGES (20)
#define MAX_CONNECTIONS (64)

/* ---------------------------------------------------------------------------------------------
 * The receiver, in the style of the original ibmsg-recv.
 * ------------------------------------------------------------------------------------------ */
#define RECV_NAME "original-recv"

ibmsg_socket* connection;
int received;
int corrupt;

void
connection_established(ibmsg_socket* conn)
{
	(void)conn;
}

void
connection_request(ibmsg_connection_request* request)
{
	connection = malloc(sizeof(ibmsg_socket));
	ibmsg_accept(request, connection);
}

void
message_received(ibmsg_socket* conn, ibmsg_buffer* msg)
{
	char why[128];
	(void)conn;
	if(msg->size != MSGSIZE || h_check(msg->data, msg->size, received, why, sizeof why))
	{
		fprintf(stderr, RECV_NAME": error: message %d is wrong (%zu bytes)\n", received, msg->size);
		corrupt++;
	}
	received++;
	if(ibmsg_free_msg(msg)) corrupt++;
}

/* Listens on ip (any port), writes the port to port_fd, receives MESSAGES messages until the
 * sender disconnects. Returns EXIT_SUCCESS or EXIT_FAILURE. */
int
receive_messages(const char* ip, int port_fd)
{
	ibmsg_event_loop event_loop;
	ibmsg_socket socket;
	unsigned short port = 0;

	connection = NULL;
	received = 0;
	corrupt = 0;

	/* Setup */
	if(ibmsg_init_event_loop(&event_loop))
	{
		fprintf(stderr, RECV_NAME": error: could not initialize event loop\n");
		return EXIT_FAILURE;
	}
	event_loop.connection_established = connection_established;
	event_loop.connection_request = connection_request;
	event_loop.message_received = message_received;

	/* Listen */
	if(ibmsg_listen(&event_loop, &socket, ip, 0, MAX_CONNECTIONS))
	{
		fprintf(stderr, RECV_NAME": error: could not listen\n");
		return EXIT_FAILURE;
	}
	if(ibmsg_socket_local_address(&socket, NULL, 0, &port) || write(port_fd, &port, sizeof port) != sizeof port)
	{
		fprintf(stderr, RECV_NAME": error: could not tell the sender the port\n");
		return EXIT_FAILURE;
	}

	/* Event loop: until the sender has disconnected */
	while(connection == NULL || connection->status != IBMSG_UNCONNECTED)
	{
		if(ibmsg_dispatch_event_loop(&event_loop))
		{
			fprintf(stderr, RECV_NAME": error: something went wrong while working in the event loop\n");
			return EXIT_FAILURE;
		}
		if(connection && connection->status == IBMSG_ERROR)
		{
			fprintf(stderr, RECV_NAME": error: the connection failed\n");
			return EXIT_FAILURE;
		}
	}
	if(received != MESSAGES)
	{
		fprintf(stderr, RECV_NAME": error: received %d messages, expected %d\n", received, MESSAGES);
		return EXIT_FAILURE;
	}

	/* Teardown */
	if(ibmsg_disconnect(&socket))
	{
		fprintf(stderr, RECV_NAME": error: could not disconnect socket\n");
		return EXIT_FAILURE;
	}
	while(socket.status != IBMSG_UNCONNECTED)
	{
		if(ibmsg_dispatch_event_loop(&event_loop))
		{
			fprintf(stderr, RECV_NAME": error: something went wrong while working in the event loop\n");
			return EXIT_FAILURE;
		}
	}
	if(ibmsg_destroy_event_loop(&event_loop))
	{
		fprintf(stderr, RECV_NAME": error: could not destroy event loop\n");
		return EXIT_FAILURE;
	}
	free(connection);

	return corrupt ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * The sender, in the style of the original ibmsg-send.
 * ------------------------------------------------------------------------------------------ */
#define SEND_NAME "original-send"

int
send_messages(const char* ip, unsigned short port)
{
	ibmsg_event_loop event_loop;
	ibmsg_socket connection;
	ibmsg_buffer msg;
	int i;

	/* Setup */
	if(ibmsg_init_event_loop(&event_loop))
	{
		fprintf(stderr, SEND_NAME": error: could not initialize event loop\n");
		return EXIT_FAILURE;
	}

	/* Connect */
	if(ibmsg_connect(&event_loop, &connection, ip, port))
	{
		fprintf(stderr, SEND_NAME": error: could not connect to remote host\n");
		return EXIT_FAILURE;
	}
	while(connection.status != IBMSG_CONNECTED)
	{
		ibmsg_dispatch_event_loop(&event_loop);
		if(connection.status == IBMSG_ERROR)
		{
			fprintf(stderr, SEND_NAME": error: could not connect to remote host\n");
			return EXIT_FAILURE;
		}
	}

	/* Data transfers */
	for(i = 0; i < MESSAGES; i++)
	{
		if(ibmsg_alloc_msg(&msg, &connection, MSGSIZE))
		{
			fprintf(stderr, SEND_NAME": error: could not allocate message memory\n");
			return EXIT_FAILURE;
		}
		h_fill(msg.data, MSGSIZE, i);
		if(ibmsg_post_send(&connection, &msg))
		{
			fprintf(stderr, SEND_NAME": error: could not send message\n");
			return EXIT_FAILURE;
		}
		while(msg.status != IBMSG_SENT)
		{
			if(ibmsg_dispatch_event_loop(&event_loop))
			{
				fprintf(stderr, SEND_NAME": error: something went wrong while working in the event loop\n");
				return EXIT_FAILURE;
			}
			if(connection.status == IBMSG_ERROR)
			{
				fprintf(stderr, SEND_NAME": error: the connection failed\n");
				return EXIT_FAILURE;
			}
		}
		if(ibmsg_free_msg(&msg))
		{
			fprintf(stderr, SEND_NAME": error: could not free memory\n");
			return EXIT_FAILURE;
		}
	}

	/* Disconnect */
	if(ibmsg_disconnect(&connection))
	{
		fprintf(stderr, SEND_NAME": error: could not disconnect\n");
		return EXIT_FAILURE;
	}
	while(connection.status != IBMSG_UNCONNECTED)
	{
		if(ibmsg_dispatch_event_loop(&event_loop))
		{
			fprintf(stderr, SEND_NAME": error: something went wrong while working in the event loop\n");
			return EXIT_FAILURE;
		}
		if(connection.status == IBMSG_ERROR)
		{
			fprintf(stderr, SEND_NAME": error: could not disconnect\n");
			return EXIT_FAILURE;
		}
	}

	/* Teardown */
	if(ibmsg_destroy_event_loop(&event_loop))
	{
		fprintf(stderr, SEND_NAME": error: could not destroy event loop\n");
		return EXIT_FAILURE;
	}
	return EXIT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * The tests. No ibmsg loop exists before fork(): each process makes its own.
 * ------------------------------------------------------------------------------------------ */

static int setup_watchdog(void **state) {
  *state = NULL;
  h_watchdog(120);
  return 0;
}

static int teardown_watchdog(void **state) {
  (void)state;
  alarm(0);
  return 0;
}

static void describe_status(int status, char *buf, size_t len) {
  if (WIFEXITED(status))
    snprintf(buf, len, "exited with status %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    snprintf(buf, len, "was killed by signal %d%s", WTERMSIG(status),
             WTERMSIG(status) == SIGALRM ? " (its 60 s alarm: it hung)" : "");
  else
    snprintf(buf, len, "ended with wait status %d", status);
}

static void receiver_and_sender_in_two_processes(void **state) {
  const char *ip = h_env("IBMSG_TEST_ADDR");
  char how[128];
  unsigned short port = 0;
  int fds[2], status = 0, rc;
  ssize_t n;
  pid_t pid;

  (void)state;
  H_CHECK(pipe(fds) == 0, "pipe() failed");
  fflush(NULL);
  pid = fork();
  H_CHECK(pid >= 0, "fork() failed");
  if (pid == 0) {
    close(fds[0]);
    alarm(60);
    _exit(receive_messages(ip, fds[1]));
  }
  close(fds[1]);
  n = read(fds[0], &port, sizeof port);
  close(fds[0]);
  if (n != (ssize_t)sizeof port) {
    waitpid(pid, &status, 0);
    describe_status(status, how, sizeof how);
    h_fail_at(__FILE__, __LINE__, "the receiver never reported its port: it %s", how);
  }
  rc = send_messages(ip, port);
  if (rc != EXIT_SUCCESS) kill(pid, SIGTERM);
  H_CHECK(waitpid(pid, &status, 0) == pid, "waitpid failed");
  H_CHECK(rc == EXIT_SUCCESS, "the sender failed (its error is printed above)");
  describe_status(status, how, sizeof how);
  H_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == EXIT_SUCCESS,
          "the receiver process %s (its error is printed above)", how);
}

struct receiver_thread {
  const char *ip;
  int port_fd;
  int result;
};

static void *run_receiver(void *arg) {
  struct receiver_thread *r = arg;
  r->result = receive_messages(r->ip, r->port_fd);
  close(r->port_fd); /* wakes the sender's read if the receiver failed before writing */
  return NULL;
}

static void receiver_and_sender_in_two_threads_with_two_loops(void **state) {
  struct receiver_thread r;
  pthread_t thread;
  unsigned short port = 0;
  int fds[2], rc;
  ssize_t n;

  (void)state;
  H_CHECK(pipe(fds) == 0, "pipe() failed");
  r.ip = h_env("IBMSG_TEST_ADDR");
  r.port_fd = fds[1];
  r.result = -1;
  H_CHECK(pthread_create(&thread, NULL, run_receiver, &r) == 0, "pthread_create failed");
  n = read(fds[0], &port, sizeof port);
  close(fds[0]);
  if (n != (ssize_t)sizeof port) {
    pthread_join(thread, NULL);
    h_fail_at(__FILE__, __LINE__, "the receiver thread never reported its port (it returned %d)",
              r.result);
  }
  rc = send_messages(r.ip, port);
  H_CHECK(rc == EXIT_SUCCESS, "the sender failed (its error is printed above); the receiver thread "
          "may still be running");
  pthread_join(thread, NULL); /* bounded by the watchdog */
  H_CHECK(r.result == EXIT_SUCCESS, "the receiver thread failed (its error is printed above)");
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(receiver_and_sender_in_two_processes, setup_watchdog,
                                      teardown_watchdog),
      cmocka_unit_test_setup_teardown(receiver_and_sender_in_two_threads_with_two_loops,
                                      setup_watchdog, teardown_watchdog),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
