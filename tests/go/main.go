// A Go client generated from doorman's proto/doorman.proto, against a doorman-node.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/golang/protobuf/proto"
	"google.golang.org/grpc"

	pb "doorman.test/pb"
)

func main() {
	conn, err := grpc.Dial(os.Args[1], grpc.WithInsecure(), grpc.WithBlock(), grpc.WithTimeout(5*time.Second))
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	defer conn.Close()
	c := pb.NewCapacityClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := c.Discovery(ctx, &pb.DiscoveryRequest{})
	if err != nil {
		fmt.Println("discovery:", err)
		os.Exit(1)
	}
	fmt.Println("is_master", d.GetIsMaster())
	r, err := c.GetCapacity(ctx, &pb.GetCapacityRequest{
		ClientId: proto.String("go-client"),
		Resource: []*pb.ResourceRequest{{ResourceId: proto.String("api"), Priority: proto.Int64(0), Wants: proto.Float64(25)}},
	})
	if err != nil {
		fmt.Println("get_capacity:", err)
		os.Exit(1)
	}
	for _, x := range r.GetResponse() {
		fmt.Println("resource", x.GetResourceId(), "capacity", x.GetGets().GetCapacity(),
			"expires_in", x.GetGets().GetExpiryTime()-time.Now().Unix(), "refresh", x.GetGets().GetRefreshInterval())
	}
	fmt.Println("mastership present", r.Mastership != nil)
	_, err = c.GetCapacity(ctx, &pb.GetCapacityRequest{
		ClientId: proto.String("go-client"),
		Resource: []*pb.ResourceRequest{{ResourceId: proto.String("api"), Priority: proto.Int64(0), Wants: proto.Float64(-1)}},
	})
	fmt.Println("bad request:", err)
}
