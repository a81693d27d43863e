/* leaderexits: a process whose main thread exits while another thread
 * runs on. ps shows it as a zombie (Z) and /proc/<pid>/environ answers
 * ESRCH, yet it is alive: TestSweepFindsALeaderThatExited. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static void *run(void *arg) {
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

int main(void) {
	pthread_t t;
	if (pthread_create(&t, NULL, run, NULL) != 0)
		return 1;
	pthread_exit(NULL);
}
