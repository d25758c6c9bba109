/* SPDX-License-Identifier: MIT */
#include "lifecycle.h"

#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace lifecycle {

bool in_peer = false;

Proc::Proc(std::vector<std::string> argv)
{
	int in[2], out[2];
	REQUIRE(pipe2(in, O_CLOEXEC) == 0);
	REQUIRE(pipe2(out, O_CLOEXEC) == 0);
	if (argv[0] == "self")
		argv[0] = "/proc/self/exe";
	std::vector<char *> args;
	for (std::string &a : argv)
		args.push_back(a.data());
	args.push_back(nullptr);
	pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		execv(args[0], args.data());
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	to = fdopen(in[1], "w");
	from = fdopen(out[0], "r");
	setvbuf(to, nullptr, _IOLBF, 0);
}

Proc::~Proc()
{
	if (pid > 0) {
		kill(pid, SIGKILL);
		waitpid(pid, nullptr, 0);
	}
	if (to)
		fclose(to);
	if (from)
		fclose(from);
}

std::string Proc::line(int ms)
{
	struct pollfd p = {fileno(from), POLLIN, 0};
	if (poll(&p, 1, ms) != 1)
		return "timeout";
	char b[256];
	if (!fgets(b, sizeof(b), from))
		return "eof";
	std::string l = b;
	if (!l.empty() && l.back() == '\n')
		l.pop_back();
	return l;
}

void Proc::send(const std::string &s) { std::fprintf(to, "%s\n", s.c_str()); }

bool Proc::wait_stopped(int ms)
{
	auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
	while (std::chrono::steady_clock::now() < end) {
		int status = 0;
		pid_t r = waitpid(pid, &status, WNOHANG | WUNTRACED);
		if (r == pid && WIFSTOPPED(status))
			return true;
		if (r == pid) {
			pid = -1;
			return false;
		}
		std::this_thread::sleep_for(std::chrono::milliseconds(2));
	}
	return false;
}

int Proc::reap(int ms)
{
	auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
	while (pid > 0 && std::chrono::steady_clock::now() < end) {
		int status = 0;
		if (waitpid(pid, &status, WNOHANG) == pid) {
			pid = -1;
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		}
		std::this_thread::sleep_for(std::chrono::milliseconds(2));
	}
	return -1;
}

Dev::Dev(enum ibv_qp_type type, bool channel)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	NEED((list && n > 0));
	ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	NEED(ctx);
	pd = ibv_alloc_pd(ctx);
	NEED(pd);
	if (channel) {
		ch = ibv_create_comp_channel(ctx);
		NEED(ch);
	}
	cq = ibv_create_cq(ctx, 64, nullptr, ch, 0);
	NEED(cq);
	struct ibv_qp_init_attr a{};
	a.send_cq = a.recv_cq = cq;
	a.qp_type = type;
	a.cap.max_send_wr = a.cap.max_recv_wr = 16;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	qp = ibv_create_qp(pd, &a);
	NEED(qp);
	struct ibv_port_attr pa{};
	NEED(ibv_query_port(ctx, 1, &pa) == 0);
	lid = pa.lid;
	struct ibv_qp_attr qa{};
	qa.qp_state = IBV_QPS_INIT;
	qa.port_num = 1;
	if (type == IBV_QPT_UD) {
		qa.qkey = ud_qkey;
		NEED(ibv_modify_qp(qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						       IBV_QP_QKEY) == 0);
		qa = {};
		qa.qp_state = IBV_QPS_RTR;
		NEED(ibv_modify_qp(qp, &qa, IBV_QP_STATE) == 0);
		qa.qp_state = IBV_QPS_RTS;
		NEED(ibv_modify_qp(qp, &qa, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
	} else {
		qa.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
		NEED(ibv_modify_qp(qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						       IBV_QP_ACCESS_FLAGS) == 0);
	}
}

int rc_to_rts(struct ibv_qp *qp, uint32_t dest, uint16_t lid, uint8_t min_rnr_timer)
{
	struct ibv_qp_attr a{};
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = min_rnr_timer;
	a.ah_attr.dlid = lid;
	a.ah_attr.port_num = 1;
	if (int e = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
						  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
						  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return e;
	a = {};
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 3;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

PageBuf::PageBuf()
{
	void *m = nullptr;
	NEED(posix_memalign(&m, 4096, n) == 0);
	p = static_cast<char *>(m);
	std::memset(p, 0, n);
}

PageBuf::~PageBuf() { std::free(p); }

Dev::~Dev()
{
	if (qp)
		ibv_destroy_qp(qp);
	if (cq)
		ibv_destroy_cq(cq);
	if (ch)
		ibv_destroy_comp_channel(ch);
	if (pd)
		ibv_dealloc_pd(pd);
	if (ctx)
		ibv_close_device(ctx);
}

Call::Call(std::function<void()> fn) : done_(std::make_shared<std::atomic<bool>>(false))
{
	thread_ = std::thread([fn = std::move(fn), done = done_] {
		fn();
		done->store(true);
	});
}

Call::~Call()
{
	if (!wait(15000)) {
		std::fprintf(stderr, "FAILED: a call did not return within 15 s\n");
		std::_Exit(1);
	}
	thread_.join();
}

bool Call::returned() const { return done_->load(); }

bool Call::wait(int ms)
{
	return eventually([this] { return returned(); }, ms);
}

int count_fds()
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	REQUIRE(d);
	while (struct dirent *e = readdir(d))
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1; /* the directory's own */
}

bool eventually(const std::function<bool()> &pred, int ms)
{
	auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
	while (!pred()) {
		if (std::chrono::steady_clock::now() > end)
			return pred();
		std::this_thread::sleep_for(std::chrono::milliseconds(5));
	}
	return true;
}

} // namespace lifecycle
