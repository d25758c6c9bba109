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

Dev::Dev(enum ibv_qp_type type, bool channel)
{
	ctx = shmv_test::open_first_device();
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
	lid = shmv_test::port_lid(ctx);
	shmv_test::QpPath path;
	path.qkey = ud_qkey;
	path.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	NEED(shmv_test::qp_to_init(qp, type, path) == 0);
	if (type == IBV_QPT_UD)
		NEED(shmv_test::qp_init_to_rts(qp, type, 0, 0, path) == 0);
}

int rc_to_rts(struct ibv_qp *qp, uint32_t dest, uint16_t lid, uint8_t min_rnr_timer)
{
	shmv_test::QpPath path;
	path.min_rnr_timer = min_rnr_timer;
	path.timeout = 14;
	return shmv_test::qp_init_to_rts(qp, IBV_QPT_RC, dest, lid, path);
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

int post_send(struct ibv_qp *qp, struct ibv_mr *mr, const PageBuf &b, uint64_t wr_id,
	      struct ibv_ah *ah, uint32_t qpn)
{
	struct ibv_send_wr wr{};
	wr.wr_id = wr_id;
	wr.opcode = IBV_WR_SEND;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = ud_qkey;
	return shmv_test::post_send_sge(qp, wr, {b.addr(2048), 16, mr->lkey});
}

UdEnd::UdEnd()
{
	mr = ibv_reg_mr(dev.pd, buf.p, buf.n, IBV_ACCESS_LOCAL_WRITE);
	NEED(mr);
	struct ibv_ah_attr aa{};
	aa.dlid = dev.lid;
	aa.port_num = 1;
	ah = ibv_create_ah(dev.pd, &aa);
	NEED(ah);
}

UdEnd::~UdEnd()
{
	if (ah)
		ibv_destroy_ah(ah);
	if (mr)
		ibv_dereg_mr(mr);
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

int count_eventfds()
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	REQUIRE(d);
	while (struct dirent *e = readdir(d)) {
		char path[300], target[64] = {};
		std::snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		ssize_t len = readlink(path, target, sizeof(target) - 1);
		n += len > 0 && std::strcmp(target, "anon_inode:[eventfd]") == 0;
	}
	closedir(d);
	return n;
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
