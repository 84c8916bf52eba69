/* Replaceable ranks (comm.h) through the launcher's respawn (launch.h):
 * rank 0, the hub, talks point to point with ranks 1 and 2, the members,
 * which also meet in barriers over a communicator of their own. Rank 2
 * kills itself after its 6th message; the launcher restarts it alone
 * (respawn_from = 1: each acknowledged message is reported as a step, so
 * the rank is past the run's start). The hub, with peer faults tolerated, sees its
 * transfer fail, empties the channels once rank 2 is restarting and takes
 * the replacement back; the replacement takes its place among the members
 * (dt_comm_split_rejoin), waits to be let in (dt_comm_rejoin_peers), asks where
 * to go on, and meets rank 1 in the next barrier, which rank 1 entered
 * before the replacement existed. Every message arrives exactly once, in
 * order; with check mode on too (the collectives' numbers go on). Without
 * respawn the same death stops the run, naming the rank.
 *
 *   test_comm_respawn          the launcher (the test)
 *   DTRAIN_RANK=... (set by it) a rank */
#include "dtrain/comm.h"
#include "dtrain/launch.h"
#include "../testlib.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define K 10  // messages per member

static int fail(const char *what, dt_status st) {
    fprintf(stderr, "rank %s: %s: %s\n", getenv("DTRAIN_RANK"), what, st == DT_OK ? "" : dt_last_error());
    return 1;
}

static int hub(dt_comm_t all) {
    dt_comm_set_peer_faults(all, 1);
    int64_t msg[3][3], ack[3];
    dt_request_t req[3] = {0};
    int next[3] = {0}, done[3] = {1, 0, 0}, state[3] = {0}, deaths = 0, rejoins = 0;
    for (int r = 1; r <= 2; r++)
        if (dt_irecv(msg[r], 3, DT_I64, r, all, &req[r]) != DT_OK) return fail("irecv", DT_ERR_COMM);
    // (a hang guard: 60 s, or TEST_HUB_WAIT seconds)
    double wait_s = getenv("TEST_HUB_WAIT") ? atof(getenv("TEST_HUB_WAIT")) : 60, t_end = dt_now() + wait_s;
    while (!(done[1] && done[2])) {
        if (dt_now() > t_end) return fail("the members did not finish in time", DT_OK);
        for (int r = 1; r <= 2; r++) {
            if (done[r]) continue;
            if (state[r]) {  // dead: 1 until it is restarting, 2 until its replacement runs
                int ps = dt_comm_peer_state(all, r, NULL);
                if (state[r] == 1 && ps == DT_PEER_RESTARTING) {
                    if (dt_comm_peer_reset(all, r) != DT_OK) return fail("peer reset", DT_ERR_COMM);
                    state[r] = 2;
                } else if (state[r] == 2 && ps == DT_PEER_RUNNING) {
                    if (dt_irecv(msg[r], 3, DT_I64, r, all, &req[r]) != DT_OK) return fail("irecv", DT_ERR_COMM);
                    state[r] = 0;
                }
                continue;
            }
            int d = 0;
            dt_status st = dt_test(&req[r], &d);
            if (st == DT_OK && d && msg[r][1] >= 0 && msg[r][1] < K) {  // a message: its ack
                if (msg[r][1] != next[r]) {
                    fprintf(stderr, "hub: member %d sent message %lld, expected %d\n", r, (long long)msg[r][1], next[r]);
                    return 1;
                }
                next[r]++;
                ack[r] = msg[r][1];
                st = dt_send(&ack[r], 1, DT_I64, r, all);
            } else if (st == DT_OK && d && msg[r][1] == -1) {  // a replacement: where to go on
                rejoins++;
                ack[r] = next[r];
                st = dt_send(&ack[r], 1, DT_I64, r, all);
            } else if (st == DT_OK && d && msg[r][1] == K) {
                done[r] = 1;
                continue;
            }
            if (st != DT_OK) {
                if (dt_comm_peer_state(all, r, NULL) == DT_PEER_RUNNING) return fail("a transfer failed", st);
                if (req[r]) dt_wait(&req[r]);
                state[r] = 1;
                deaths++;
                printf("hub: member %d died (%s)\n", r, dt_last_error());
                continue;
            }
            if (d && dt_irecv(msg[r], 3, DT_I64, r, all, &req[r]) != DT_OK) return fail("irecv", DT_ERR_COMM);
        }
        usleep(100);
    }
    if (next[1] != K || next[2] != K || deaths != 1 || rejoins != 1) {
        fprintf(stderr, "hub: %d and %d messages, %d deaths, %d rejoins (expected %d, %d, 1, 1)\n", next[1], next[2],
                deaths, rejoins, K, K);
        return 1;
    }
    printf("hub: %d messages from each member, member 2 died once and rejoined\n", K);
    return 0;
}

static int member(dt_comm_t all, int r) {
    dt_comm_t mem;
    int inc = dt_comm_incarnation(all), i0 = 0;
    dt_status st;
    int64_t m[3], ack;
    if (inc > 0) {  // a replacement
        int h = 0;
        if ((st = dt_comm_split_rejoin(all, 1, &mem)) != DT_OK) return fail("split rejoin", st);
        if ((st = dt_comm_rejoin_peers(all, &h, 1)) != DT_OK) return dt_comm_destroy(mem), fail("rejoin", st);
        m[0] = r, m[1] = -1, m[2] = inc;
        if ((st = dt_send(m, 3, DT_I64, 0, all)) != DT_OK || (st = dt_recv(&ack, 1, DT_I64, 0, all)) != DT_OK)
            return dt_comm_destroy(mem), fail("asking where to go on", st);
        i0 = (int)ack;
        printf("member %d (incarnation %d): rank %d of %d among the members, going on with message %d\n", r, inc,
               dt_comm_rank(mem), dt_comm_size(mem), i0);
    } else if ((st = dt_comm_split(all, 1, r, &mem)) != DT_OK) {
        return fail("split", st);
    }
    for (int i = i0; i < K; i++) {
        if (r == 2 && inc == 0 && i == 6) raise(SIGKILL);
        m[0] = r, m[1] = i, m[2] = inc;
        if ((st = dt_send(m, 3, DT_I64, 0, all)) != DT_OK || (st = dt_recv(&ack, 1, DT_I64, 0, all)) != DT_OK)
            return dt_comm_destroy(mem), fail("a message", st);
        if (ack != i) return dt_comm_destroy(mem), fail("a wrong ack", DT_OK);
        dt_heartbeat(i);  // past the start: a death from here on is replaced alone
        if ((i == 4 || i == 8) && (st = dt_barrier(mem)) != DT_OK)
            return dt_comm_destroy(mem), fail("the members' barrier", st);
    }
    m[0] = r, m[1] = K, m[2] = inc;
    if ((st = dt_send(m, 3, DT_I64, 0, all)) != DT_OK) return dt_comm_destroy(mem), fail("the end", st);
    dt_comm_destroy(mem);
    return 0;
}

static int rank_main(void) {
    dt_comm_t all;
    dt_status st = dt_comm_init_env(&all);
    if (st != DT_OK) return fail("init", st);
    int r = dt_comm_rank(all), rc;
    if (r == 0) {
        dt_comm_t none;
        if ((st = dt_comm_split(all, 0, 0, &none)) != DT_OK) return fail("split", st);
        rc = hub(all);
        dt_comm_destroy(none);
    } else {
        rc = member(all, r);
    }
    dt_comm_destroy(all);
    return rc;
}

int main(int argc, char **argv) {
    (void)argc;
    if (getenv("DTRAIN_RANK")) return rank_main();
    setenv("DTRAIN_COMM_TIMEOUT", "30", 1);
    for (int check = 0; check <= 1; check++) {
        setenv("DTRAIN_COMM_CHECK", check ? "1" : "0", 1);
        dt_launch_params p = dt_launch_default_params();
        p.nranks = 3;
        p.respawn_from = 1;
        p.max_respawns = 1;
        dt_launch_result res;
        double t0 = dt_now();
        dt_status st = dt_launch(&p, (char *[]){argv[0], NULL}, &res);
        CHECK(st == DT_OK && res.exit_code == 0 && res.respawns == 1,
              "check mode %d: rank 2 killed, restarted alone: launch %d, exit %d, %d restarts (1), %.1f s", check, st,
              res.exit_code, res.respawns, dt_now() - t0);
    }
    // Without respawn the death stops every rank: the launcher ends the
    // survivors, which would otherwise wait far longer than ctest does (the
    // hub for 1000 s, the communicator's timeout 1000 s): then the test
    // hangs, it never passes late.
    setenv("DTRAIN_COMM_TIMEOUT", "1000", 1);
    setenv("TEST_HUB_WAIT", "1000", 1);
    dt_launch_params p = dt_launch_default_params();
    p.nranks = 3;
    dt_launch_result res;
    dt_status st = dt_launch(&p, (char *[]){argv[0], NULL}, &res);
    CHECK(st == DT_OK && res.exit_code == 128 + SIGKILL && res.failed_rank == 2 && res.respawns == 0,
          "without respawn: exit %d (137), failed rank %d (2)", res.exit_code, res.failed_rank);
    return tl_finish();
}
